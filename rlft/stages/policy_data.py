"""Reward-model data from a policy's own samples (algo.source=policy for rm and prm).

A reward model that only saw the generator's corrupted solutions scores the policy's own mistakes
poorly; here it trains (and is evaluated) on what the policy it will judge actually writes:

1. every rank samples `rollout.samples_per_prompt` completions of `algo.sample_from` (this run's SFT
   by default) for its share of `algo.num_prompts` questions of the split;
2. the answer verifier marks each completion correct or not;
3. RM: (correct, incorrect) pairs of one question. PRM: each step labelled `exact` (built-in task:
   checked against the worked solution) or `mc` (Math-Shepherd: `algo.mc_completions` continuations
   of each step's prefix by the same model; 1 when one reaches the gold answer). With `mc` on the
   built-in task the exact labels are computed too and their agreement reported.

Every rank ends with the same list (gathered in question order). Each example keeps its text row
(`row`: RM {prompt_text, chosen, rejected}, PRM {prompt_text, steps, labels}); the stage writes the
training rows to <stage>/train_data.jsonl, the history iterative RL replays (docs/algorithms.md §4).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from rlft import dist, envs
from rlft.data import labels as L
from rlft.data.encode import encode_pair, encode_prompts, encode_steps, prompt_budget
from rlft.envs import episodes
from rlft.files.integrity import write_text_atomic
from rlft.model_source import resolve_model_path
from rlft.models import load_model
from rlft.rewards.scoring import split_steps
from rlft.rollout.generate import Frozen, Sampling, build_engine
from rlft.stages import inputs

SPLIT_SEED = {"train": 0, "test": 1}


class PolicySampler:
    """The sampled model behind a rollout engine, for one reward-model stage."""

    def __init__(self, cfg, tokenizer, device):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.env = envs.build(cfg, tokenizer)
        path = resolve_model_path(cfg, cfg.algo.sample_from)
        self.model = load_model(cfg.model, path, tokenizer, seed=cfg.seed).to(device).eval()
        self.engine, why = build_engine(cfg, Frozen(self.model), tokenizer, device, seed=cfg.seed)
        self.engine.sync_weights(0)
        rollout = cfg.rollout
        self.sampling = Sampling.of_rollout(rollout)
        self.budget = prompt_budget(self.model, rollout.max_new_tokens)
        dist.print0(f"[rlft] {cfg.algo.name}: labelling samples of {path}; rollout engine: {why}")

    def generate(self, texts: list[str], rows: list[dict], n: int, seed: int) -> list[list[str]]:
        """n trajectories through the environment for each prompt text (rows: what the environment reads)."""
        prompt_ids = encode_prompts(self.tokenizer, texts, self.budget, "reward-model samples")
        gens = episodes.sample(self.engine, self.env, rows, prompt_ids, n, self.sampling, seed, self.tokenizer,
                               episodes.limits(self.cfg, self.env, self.tokenizer))
        return [gens.texts[i * n:(i + 1) * n] for i in range(len(texts))]

    def close(self) -> None:
        self.engine.close()


def questions(cfg, env, split: str, count: int) -> list[dict]:
    """{row, gold_steps (built-in task only)} for the first `count` rows of the split."""
    rows = env.rows(split)[:count or None]
    steps = [r["steps"] for r in inputs.builtin_rows(cfg, split)] if inputs.is_builtin(cfg) else [None] * len(rows)
    return [{"row": r, "gold_steps": s} for r, s in zip(rows, steps)]


def judged_samples(sampler: PolicySampler, cfg, split: str, count: int) -> list[dict]:
    """This rank's share of the questions, each with G completions judged by the environment (G consecutive
    records)."""
    info = dist.info()
    mine = questions(cfg, sampler.env, split, count)[info.rank::info.world_size]
    texts = [inputs.render(cfg, sampler.tokenizer, q["row"]) for q in mine]
    torch.manual_seed(cfg.seed * 7 + SPLIT_SEED[split] * 1000 + info.rank)
    samples = sampler.generate(texts, [q["row"] for q in mine], cfg.rollout.samples_per_prompt,
                               seed=(cfg.seed * 1009 + SPLIT_SEED[split]) * 4099 + info.rank)
    return [{"prompt_text": t, "completion": c, "row": q["row"], "gold_steps": q["gold_steps"],
             "correct": bool(sampler.env.score(q["row"], c).correct)}
            for q, t, group in zip(mine, texts, samples) for c in group]


def gathered(local: list) -> list:
    """Every rank's list, concatenated in rank order (the same on every rank)."""
    return [x for part in dist.all_gather_object(local) for x in part]


def pair_examples(cfg, tokenizer, split: str, count: int, device) -> tuple[list[dict], dict]:
    """RM examples from (correct, incorrect) sample pairs, and what was sampled."""
    sampler = PolicySampler(cfg, tokenizer, device)
    try:
        records = judged_samples(sampler, cfg, split, count)
    finally:
        sampler.close()
    pairs = L.outcome_pairs(records, cfg.rollout.samples_per_prompt)
    examples = gathered(encode_rows("rm", tokenizer, pairs, cfg.train.max_seq_len))
    return examples, summary(split, records)


def step_examples(cfg, tokenizer, split: str, count: int, device) -> tuple[list[dict], dict]:
    """PRM examples: every sample's steps with exact or Monte-Carlo labels, and what was measured."""
    algo = cfg.algo
    sampler = PolicySampler(cfg, tokenizer, device)
    try:
        records = judged_samples(sampler, cfg, split, count)
        rows, agree, total = [], 0, 0
        for i, r in enumerate(records):
            steps, _ = split_steps(r["completion"])
            if not steps:
                continue
            solves = lambda text, row=r["row"]: sampler.env.score(row, text).correct  # noqa: E731
            exact = L.exact_step_labels(steps, r["gold_steps"], solves) if r["gold_steps"] is not None else None
            if algo.labels == "exact":
                labels = exact
            elif r["correct"]:  # its own completion reaches the gold answer from every prefix
                labels = [1] * len(steps)
            else:
                prefixes = L.step_prefixes(steps)
                continuations = sampler.generate([r["prompt_text"] + p for p in prefixes], [r["row"]] * len(prefixes),
                                                 algo.mc_completions,
                                                 seed=(cfg.seed * 31 + i) * 4099 + dist.info().rank)
                labels, _ = L.mc_step_labels(continuations, prefixes, solves)
            if exact is not None and algo.labels == "mc":
                agree += sum(x == y for x, y in zip(labels, exact))
                total += len(steps)
            # the question and the outcome let the held-out evaluation pair a correct with an incorrect sample
            row = {"prompt_text": r["prompt_text"], "steps": steps, "labels": labels}
            rows.append({**encode_steps(tokenizer, r["prompt_text"], steps, labels, cfg.train.max_seq_len),
                         "row": row, "question": r["prompt_text"], "correct": r["correct"]})
    finally:
        sampler.close()
    examples = gathered([ex for ex in rows if ex["step_positions"]])
    out = summary(split, records)
    if total or algo.labels == "mc":
        agree, total = dist.all_reduce_sum([float(agree), float(total)])
        if total:
            out[f"{split}_mc_exact_agreement"] = agree / total
    labels_1, steps_n = dist.all_reduce_sum([float(sum(sum(ex["step_labels"]) for ex in rows)),
                                             float(sum(len(ex["step_labels"]) for ex in rows))])
    out[f"{split}_step_label_mean"] = labels_1 / max(steps_n, 1.0)
    return examples, out


def encode_rows(kind: str, tokenizer, rows: list[dict], max_len: int) -> list[dict]:
    """Text rows -> training examples that keep their row: rm {prompt_text, chosen, rejected} pairs, prm
    {prompt_text, steps, labels} solutions (those whose steps all fall past max_len are dropped)."""
    if kind == "rm":
        return [{**encode_pair(tokenizer, r["prompt_text"], r["chosen"], r["rejected"], max_len), "row": r}
                for r in rows]
    out = [{**encode_steps(tokenizer, r["prompt_text"], r["steps"], r["labels"], max_len), "row": r}
           for r in rows if r["steps"]]
    return [ex for ex in out if ex["step_positions"]]


TRAIN_DATA = "train_data.jsonl"


def save_rows(path: Path, examples: list[dict]) -> int:
    """Write the text rows of `examples` (those that have one) as JSON lines, atomically; the count."""
    rows = [ex["row"] for ex in examples if "row" in ex]
    if rows:
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def load_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_data_file(model_dir: str | Path) -> Path:
    """Where a reward model's training rows are kept: beside its final/ directory (a stage's output) or
    as <dir>_train_data.jsonl beside a directory saved by iterative RL."""
    model_dir = Path(model_dir)
    if model_dir.name == "final":
        return model_dir.parent / TRAIN_DATA
    return model_dir.with_name(model_dir.name + "_" + TRAIN_DATA)


def summary(split: str, records: list[dict]) -> dict:
    """Samples drawn and the share correct, over all ranks."""
    n, correct = dist.all_reduce_sum([float(len(records)), float(sum(r["correct"] for r in records))])
    return {f"{split}_samples": n, f"{split}_sample_accuracy": correct / max(n, 1.0)}
