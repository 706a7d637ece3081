"""`rlft eval`: greedy accuracy, unbiased pass@k and maj@k (ALGORITHMS.md §11) of a checkpoint.

    rlft eval run.name=demo                           # this run's SFT output (model.path=auto)
    rlft eval model.path=stage:grpo run.name=demo     # another stage of the run
    rlft eval model.path=/path/to/hf_dir data=gsm8k data.source=/path/to/gsm8k

Per problem: one greedy completion (accuracy) and eval.samples sampled completions at
eval.temperature (pass@k with the unbiased estimator, maj@k by majority vote over extracted
answers). Writes eval.json and prints a table.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch

from rlft import handoff
from rlft.data.encode import encode_prompt
from rlft.eval.metrics import maj_at_k, pass_at_k
from rlft.models import load_model, load_tokenizer
from rlft.rewards.verifiers import answers_match, extract_answer, gold_answer
from rlft.rollout.generate import SamplingConfig, generate
from rlft.stages import inputs


def eval_model_path(cfg) -> str:
    """model.path=auto means this run's output of the current algo (default: sft)."""
    path = cfg.model.path
    if path == "auto":
        path = handoff.STAGE_PREFIX + cfg.algo.name
    return handoff.resolve_model_path(cfg, path)


def output_dir(cfg, model_ref: str) -> Path:
    """runs/<run.name>/eval/<tag>: the stage name, or the directory holding a `final/` model."""
    if model_ref.startswith(handoff.STAGE_PREFIX):
        tag = model_ref[len(handoff.STAGE_PREFIX):]
    elif Path(model_ref).name == "final":
        tag = Path(model_ref).parent.name
    else:
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", model_ref.strip("/"))[-80:]
    return Path(cfg.run.root) / cfg.run.name / "eval" / tag


def score_problems(problems: list[dict], greedy_texts: list[str], sampled_texts: list[list[str]],
                   ks: list[int]) -> dict:
    """Aggregate metrics from completions (pure: no model). problems[i]['answer'] is the gold."""
    golds = [gold_answer(p["answer"]) for p in problems]
    greedy_ok = [answers_match(extract_answer(t), g) for t, g in zip(greedy_texts, golds)]
    out = {"num_problems": len(problems), "greedy_accuracy": sum(greedy_ok) / max(len(problems), 1)}
    for k in ks:
        passes, majs = [], []
        for texts, gold in zip(sampled_texts, golds):
            answers = [extract_answer(t) for t in texts]
            correct = sum(answers_match(a, gold) for a in answers)
            passes.append(pass_at_k(len(texts), correct, k))
            majs.append(maj_at_k(answers, gold, k))
        out[f"pass@{k}"] = sum(passes) / max(len(passes), 1)
        out[f"maj@{k}"] = sum(majs) / max(len(majs), 1)
    return out


def format_table(metrics: dict) -> str:
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in metrics.items()]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 12)
    return "\n".join([line] + [f"{k:<{width}}  {v:>9}" for k, v in rows] + [line])


def evaluate_model(model, tokenizer, cfg, problems: list[dict], device: torch.device) -> dict:
    """Greedy and sampled completions for every problem, then the metrics."""
    e = cfg.eval
    prompts = [encode_prompt(tokenizer, inputs.render(cfg, tokenizer, p["prompt"])) for p in problems]
    torch.manual_seed(e.seed)
    tic = time.time()
    greedy = generate(model, tokenizer, prompts, 1, SamplingConfig(e.max_new_tokens, False, batch_size=e.batch_size),
                      device)
    sampled = generate(model, tokenizer, prompts, e.samples,
                       SamplingConfig(e.max_new_tokens, True, e.temperature, e.top_p, 0, e.batch_size), device)
    seconds = time.time() - tic
    grouped = [sampled.texts[i * e.samples:(i + 1) * e.samples] for i in range(len(problems))]
    metrics = score_problems(problems, greedy.texts, grouped, list(e.k))
    lengths = [len(c) for c in sampled.completion_ids]
    metrics.update(
        mean_response_tokens=sum(lengths) / max(len(lengths), 1),
        truncation_rate=sum(sampled.truncated) / max(len(sampled.truncated), 1),
        greedy_truncation_rate=sum(greedy.truncated) / max(len(greedy.truncated), 1),
        generation_seconds=round(seconds, 2),
    )
    return metrics, greedy, grouped


def run_eval(cfg) -> dict:
    model_ref = cfg.model.path if cfg.model.path != "auto" else handoff.STAGE_PREFIX + cfg.algo.name
    path = eval_model_path(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.engine.device != "cpu" else "cpu")
    tokenizer = load_tokenizer(cfg.model, path)
    model = load_model(cfg.model, path, tokenizer, head="causal_lm", seed=cfg.seed).to(device)
    problems = inputs.qa_rows(cfg, "test")
    if cfg.eval.num_problems:
        problems = problems[:cfg.eval.num_problems]
    print(f"[rlft] eval {model_ref}: {len(problems)} problems, greedy + {cfg.eval.samples} samples "
          f"at temperature {cfg.eval.temperature}", flush=True)
    metrics, greedy, grouped = evaluate_model(model, tokenizer, cfg, problems, device)
    out_dir = output_dir(cfg, model_ref)
    record = {"model": model_ref, "resolved_path": path, "data": cfg.data.source, "metrics": metrics,
              "settings": {"samples": cfg.eval.samples, "k": list(cfg.eval.k), "temperature": cfg.eval.temperature,
                           "top_p": cfg.eval.top_p, "max_new_tokens": cfg.eval.max_new_tokens}}
    handoff.write_json_atomic(out_dir / "eval.json", record)
    examples = [{"prompt": p["prompt"], "gold": p["answer"], "greedy": g, "samples": s}
                for p, g, s in zip(problems[:20], greedy.texts, grouped)]
    (out_dir / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in examples))
    print(format_table(metrics))
    print(f"[rlft] wrote {out_dir / 'eval.json'}")
    return record
