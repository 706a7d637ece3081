"""`rlft eval`: accuracy, unbiased pass@k and maj@k (docs/algorithms.md §11), reward, RM score and KL
to a reference, for one checkpoint or several.

    rlft eval run.name=demo                           # this run's SFT output (model.path=auto)
    rlft eval model.path=stage:grpo run.name=demo     # another stage of the run
    rlft eval eval.models=[stage:sft,stage:grpo,stage:ppo] run.name=demo   # a comparison table
    rlft eval model.path=/path/to/hf_dir data=gsm8k data.source=/path/to/gsm8k

Per problem: one greedy completion (accuracy), eval.samples sampled completions at
eval.temperature (pass@k with the unbiased estimator, maj@k as the expected majority vote of k of
them), and eval.policy_samples completions at temperature 1, the policy's own distribution,
on which the reward sources (reward.functions, each on its own and their weighted total), the
RM score and the sequence-level KL to the reference are measured:

    KL(pi || ref) = E_{y ~ pi} [ sum_t log pi(y_t | .) - log ref(y_t | .) ]

(the k1 estimator over whole sequences, unbiased; nats per completion). Writes eval.json and
samples.jsonl (every problem's completions with their extracted answers and correctness) per model,
then comparison.md and comparison.csv over every model evaluated in the run.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlft import envs
from rlft.data.encode import encode_prompts, prompt_budget
from rlft.data.loading import DataError
from rlft.envs import episodes
from rlft.errors import ConfigError, MissingInputError
from rlft.eval.compare import write_comparison
from rlft.eval.metrics import maj_at_k_votes, pass_at_k
from rlft.files import handoff, rundir
from rlft.model_source import resolve_model_path
from rlft.models import load_model, load_tokenizer
from rlft.rewards.scoring import RewardSet, ScoringModel
from rlft.rollout import batch as rb
from rlft.rollout.generate import Frozen, Sampling, build_engine
from rlft.rollout.logprobs import batched_token_logp
from rlft.stages import inputs


def eval_model_path(cfg) -> str:
    """model.path=auto means this run's output of the current algo (default: sft)."""
    path = cfg.model.path
    if path == "auto":
        path = handoff.STAGE_PREFIX + cfg.algo.name
    return resolve_model_path(cfg, path)


def output_dir(cfg, model_ref: str) -> Path:
    """runs/<run.name>/eval/<tag>: eval.tag, the stage name, the directory holding a `final/` model, a local model's
    own name (a GGUF file's without `.gguf`), a package's name, else the hub id."""
    local = Path(model_ref).expanduser()
    if cfg.eval.tag:
        tag = cfg.eval.tag
    elif model_ref.startswith(handoff.STAGE_PREFIX):
        tag = model_ref[len(handoff.STAGE_PREFIX):]
    elif local.name == "final":
        tag = local.parent.name
    elif local.exists():
        tag = local.name[:-len(".gguf")] if local.name.endswith(".gguf") else local.name
    elif model_ref.startswith("package:"):
        tag = model_ref[len("package:"):]
    else:
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", model_ref.strip("/"))[-80:]
    return Path(cfg.run.root) / cfg.run.name / "eval" / tag


def score_problems(greedy: list, sampled: list[list], ks: list[int]) -> dict:
    """Aggregate metrics from the environment's verdicts (Score) on each problem's greedy completion and
    samples (pure: no model, no environment)."""
    out = {"num_problems": len(greedy), "greedy_accuracy": sum(v.correct for v in greedy) / max(len(greedy), 1)}
    for k in ks:
        passes, majs = [], []
        for judged in sampled:
            keys = [v.answer for v in judged]
            passes.append(pass_at_k(len(judged), sum(v.correct for v in judged), k))
            majs.append(maj_at_k_votes(keys, {v.answer for v in judged if v.correct}, k))
        out[f"pass@{k}"] = sum(passes) / max(len(passes), 1)
        out[f"maj@{k}"] = sum(majs) / max(len(majs), 1)
    return out


def sample_records(env, problems: list[dict], greedy_texts: list[str], sampled_texts: list[list[str]],
                   greedy: list, sampled: list[list]) -> list[dict]:
    """One record per problem: every completion with its extracted answer, reward and correctness (the
    verdicts `score_problems` counted), so the figures can be recomputed from samples.jsonl alone."""
    def scored(text: str, v) -> dict:
        return {"text": text, "answer": v.answer, "reward": v.reward, "correct": bool(v.correct)}

    return [{"prompt": p["prompt"], "gold": env.gold(p), "greedy": scored(g_text, g),
             "samples": [scored(t, v) for t, v in zip(texts, judged)]}
            for p, g_text, texts, g, judged in zip(problems, greedy_texts, sampled_texts, greedy, sampled)]


def format_table(metrics: dict) -> str:
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in metrics.items()]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 12)
    return "\n".join([line] + [f"{k:<{width}}  {v:>9}" for k, v in rows] + [line])


def eval_prompts(cfg, tokenizer, problems: list[dict], model) -> list[list[int]]:
    return encode_prompts(tokenizer, [inputs.render(cfg, tokenizer, p) for p in problems],
                          prompt_budget(model, cfg.eval.max_new_tokens), "eval")


def evaluate_model(engine, model, tokenizer, cfg, problems: list[dict], env) -> dict:
    """Greedy and sampled trajectories for every problem (through the rollout `engine` and the
    environment), then the metrics."""
    eval_cfg = cfg.eval
    prompts = eval_prompts(cfg, tokenizer, problems, model)
    limits = episodes.limits(cfg, env, tokenizer)
    torch.manual_seed(eval_cfg.seed)
    tic = time.time()
    greedy_sampling = Sampling(eval_cfg.max_new_tokens, False)
    sampling = Sampling(eval_cfg.max_new_tokens, True, eval_cfg.temperature, eval_cfg.top_p, 0)
    greedy = episodes.sample(engine, env, problems, prompts, 1, greedy_sampling, eval_cfg.seed, tokenizer, limits)
    sampled = episodes.sample(engine, env, problems, prompts, eval_cfg.samples, sampling, eval_cfg.seed + 1,
                              tokenizer, limits)
    seconds = time.time() - tic
    grouped = [sampled.texts[i * eval_cfg.samples:(i + 1) * eval_cfg.samples] for i in range(len(problems))]
    verdicts = (env.scores(problems, greedy.texts), [env.scores([p] * len(texts), texts)
                                                     for p, texts in zip(problems, grouped)])
    metrics = score_problems(*verdicts, list(eval_cfg.k))
    lengths = [sum(w) for w in sampled.token_mask] if sampled.token_mask is not None else \
        [len(c) for c in sampled.completion_ids]
    metrics.update(
        mean_response_tokens=sum(lengths) / max(len(lengths), 1),
        truncation_rate=sum(sampled.truncated) / max(len(sampled.truncated), 1),
        greedy_truncation_rate=sum(greedy.truncated) / max(len(greedy.truncated), 1),
        generation_seconds=round(seconds, 2),
    )
    if sampled.tool_calls is not None:  # multi-turn: how the samples used the environment
        metrics.update(tool_use_rate=sum(c > 0 for c in sampled.tool_calls) / max(len(sampled.tool_calls), 1),
                       tool_calls_per_sample=sum(sampled.tool_calls) / max(len(sampled.tool_calls), 1),
                       tool_error_rate=sum(sampled.tool_errors) / max(sum(sampled.tool_calls), 1),
                       mean_turns=sum(sampled.turns) / max(len(sampled.turns), 1))
    return metrics, greedy, grouped, verdicts


def optional_model(cfg, ref: str, evaluated_path: str) -> str | None:
    """eval.reference / eval.rm: none -> None; auto -> this run's stage output if complete (and not
    the evaluated model itself); anything else must resolve."""
    if ref == "none":
        return None
    if ref.startswith("auto"):
        stage = ref.partition(":")[2] or "sft"
        try:
            path = resolve_model_path(cfg, handoff.STAGE_PREFIX + stage)
        except MissingInputError:
            return None
        same = Path(path).resolve() == Path(evaluated_path).resolve() if Path(evaluated_path).exists() else False
        return None if same else path
    return resolve_model_path(cfg, ref)


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence sum_t (log pi - log ref) over response tokens [N] (k1; unbiased for KL(pi||ref)
    when the sequences were sampled from pi)."""
    return torch.where(mask.bool(), logp - ref_logp, torch.zeros((), dtype=logp.dtype)).sum(-1)


def policy_sample_metrics(engine, model, tokenizer, cfg, problems: list[dict], prompts: list[list[int]],
                          device: torch.device, reference: str | None, rm: str | None, env) -> dict:
    """Reward sources, RM score and KL to the reference on eval.policy_samples completions per problem
    drawn at temperature 1 (through the rollout `engine`; the KL's log-probs from `model`)."""
    eval_cfg = cfg.eval
    policy_sampling = Sampling(eval_cfg.max_new_tokens, True, 1.0, 1.0, 0)  # the policy's own distribution
    gens = episodes.sample(engine, env, problems, prompts, eval_cfg.policy_samples, policy_sampling,
                           eval_cfg.seed + 2, tokenizer, episodes.limits(cfg, env, tokenizer))
    rows = [problems[i] for i in gens.prompt_index]
    prompt_texts = [tokenizer.decode(prompts[i]) for i in gens.prompt_index]
    out: dict = {"policy_samples": len(gens.texts)}
    rewards = RewardSet(cfg, device, env)
    total, per_source = rewards([r["prompt"] for r in rows], prompt_texts, gens.texts, rows)
    out["reward"] = float(total.mean())
    for name, values in per_source.items():
        out[f"reward/{name}"] = sum(values) / max(len(values), 1)
    if rm is not None:
        scores = per_source.get("rm") if "rm" in rewards.models else \
            ScoringModel(cfg, "rm", rm, device).outcome(prompt_texts, gens.texts)
        out["rm_score"] = sum(scores) / max(len(scores), 1)
    if reference is not None:
        ids, attn, mask = rb.build_sequences([prompts[i] for i in gens.prompt_index], gens.completion_ids,
                                             tokenizer.pad_token_id, gens.token_mask)
        ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
        ref_model = load_model(cfg.model, reference, load_tokenizer(cfg.model, reference), head="causal_lm")
        ref_model = ref_model.to(device).eval()
        logp = batched_token_logp(model, ids, attn, eval_cfg.batch_size)
        ref_logp = batched_token_logp(ref_model, ids, attn, eval_cfg.batch_size)
        kl = sequence_kl(logp, ref_logp, mask)
        out["kl_to_ref"] = float(kl.mean())
        out["kl_to_ref_per_token"] = float(kl.sum() / mask.sum().clamp(min=1))
    return out


def eval_one(cfg, model_ref: str) -> dict:
    """Evaluate one checkpoint; writes eval.json and samples.jsonl under runs/<name>/eval/<tag>/."""
    cfg = _with_model(cfg, model_ref)
    path = eval_model_path(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.deepspeed.device != "cpu" else "cpu")
    tokenizer = load_tokenizer(cfg.model, path)
    model = load_model(cfg.model, path, tokenizer, head="causal_lm", seed=cfg.seed).to(device).eval()
    env = envs.build(cfg, tokenizer)
    problems = env.rows("test")
    if not problems:
        raise DataError(f"{cfg.data.source}: the test split ({cfg.data.test_split}) has no rows to evaluate")
    env.check_rows(problems, f"{cfg.data.source} [test]")
    if cfg.eval.num_problems:
        problems = problems[:cfg.eval.num_problems]
    eval_cfg = cfg.eval
    reference = optional_model(cfg, eval_cfg.reference, path) if eval_cfg.policy_samples else None
    rm_ref = "auto:rm" if eval_cfg.rm == "auto" else eval_cfg.rm
    rm = optional_model(cfg, rm_ref, path) if eval_cfg.policy_samples else None
    print(f"[rlft] eval {model_ref}: {len(problems)} problems, greedy + {eval_cfg.samples} samples at temperature "
          f"{eval_cfg.temperature}" + (f" + {eval_cfg.policy_samples} at temperature 1" if eval_cfg.policy_samples else "")
          + (f"; KL to {reference}" if reference else "") + (f"; RM {rm}" if rm else ""), flush=True)
    engine, why = build_engine(cfg, Frozen(model), tokenizer, device, seed=eval_cfg.seed)
    try:
        engine.sync_weights(0)  # started outside the timing below
        print(f"[rlft] rollout engine: {why}", flush=True)
        metrics, greedy, grouped, verdicts = evaluate_model(engine, model, tokenizer, cfg, problems, env)
        if eval_cfg.policy_samples:
            prompts = eval_prompts(cfg, tokenizer, problems, model)
            torch.manual_seed(eval_cfg.seed + 1)
            metrics.update(policy_sample_metrics(engine, model, tokenizer, cfg, problems, prompts, device, reference,
                                                 rm, env))
    finally:  # the next checkpoint of eval.models starts its own engine in this process
        engine.close()
    out_dir = output_dir(cfg, model_ref)
    record = {"model": model_ref, "resolved_path": path, "data": cfg.data.source, "env": str(cfg.env.name),
              "metrics": metrics, "reference": reference, "rm": rm,
              "settings": {"samples": eval_cfg.samples, "k": list(eval_cfg.k), "temperature": eval_cfg.temperature,
                           "top_p": eval_cfg.top_p, "max_new_tokens": eval_cfg.max_new_tokens,
                           "policy_samples": eval_cfg.policy_samples,
                           "reward_functions": list(cfg.reward.functions)}}
    handoff.write_json_atomic(out_dir / "eval.json", record)
    handoff.write_jsonl_atomic(out_dir / "samples.jsonl",
                               sample_records(env, problems, greedy.texts, grouped, *verdicts))
    print(format_table(metrics))
    print(f"[rlft] wrote {out_dir / 'eval.json'}")
    return record


def run_eval(cfg) -> list[dict]:
    """Every model of eval.models (or model.path), then the run's comparison table."""
    refs = list(cfg.eval.models) or [cfg.model.path if cfg.model.path != "auto"
                                     else handoff.STAGE_PREFIX + cfg.algo.name]
    if cfg.eval.tag and len(refs) > 1:
        raise ConfigError("eval.tag names one evaluation; drop it when eval.models lists several checkpoints")
    for ref in refs:  # fail on a missing checkpoint or an unwritable output before spending time on the others
        eval_model_path(_with_model(cfg, ref))
        rundir.make_dir(output_dir(_with_model(cfg, ref), ref))
    line = envs.build(cfg).describe()  # what the environment runs under (a sandbox refused before any model loads)
    if line:
        print(f"[rlft] {line}", flush=True)
    records = [eval_one(cfg, ref) for ref in refs]
    eval_root = Path(cfg.run.root) / cfg.run.name / "eval"
    table = write_comparison(eval_root, [output_dir(_with_model(cfg, ref), ref).name for ref in refs])
    if len(refs) > 1:
        print(table)
    print(f"[rlft] wrote {eval_root / 'comparison.md'} and comparison.csv")
    return records


def _with_model(cfg, ref: str):
    return OmegaConf.merge(cfg, {"model": {"path": ref}})
