"""Iterative RL (DeepSeekMath §4.1.4, Algorithm 1): between iterations, the reward model learns
from the current policy's samples and the reference becomes the current policy.

At the end of iteration k (before iteration k+1 starts):
  1. the policy is saved to iterations/iter-k/policy (a Hugging Face directory);
  2. every reward model in use (RM and/or PRM) trains for `iterative.rm_steps` steps on
     data labelled by the rule verifier from iteration k's samples, mixed with a replay of its
     earlier training data making up `iterative.replay_ratio` (10%) of the mix; it is saved to
     iterations/iter-k/<rm|prm>, the rows it added to iterations/iter-k/<rm|prm>_train_data.jsonl.
     Earlier training data: the rows its stage trained on (<stage>/train_data.jsonl, written when
     they were policy samples; otherwise the data's own pairs / step labels) and every earlier
     iteration's added rows;
       RM  pairs: (correct, incorrect) completions of the same prompt;
       PRM step labels (`iterative.step_labels`), for the newest `iterative.label_budget` incorrect and
           as many correct completions: mc, the Math-Shepherd hard estimate (§2.2): every step of a correct
           completion is 1; a step of an incorrect one is 1 when any of `iterative.label_completions`
           continuations of its prefix, sampled from the current policy, reaches the gold answer;
           exact (built-in task): each step checked against the worked solution;
  3. the reference model is reloaded from iterations/iter-k/policy (`iterative.reset_reference`,
     default; false keeps the starting model as the reference).

A run resumed inside iteration k >= 1 reloads the reward models and (when it resets) the reference from
iterations/iter-(k-1)/ (`restore`), and the checkpoint carries iteration k's samples so far, so
the retraining at the end of iteration k sees the same data as without the interruption.
"""
from __future__ import annotations

import functools
import random
from pathlib import Path

from omegaconf import OmegaConf

from rlft import dist
from rlft.data import labels as L
from rlft.data.encode import encode_prompt
from rlft.files.handoff import save_hf_dir, stage_config
from rlft.models import load_model
from rlft.rewards.scoring import split_steps
from rlft.rollout.sampling import Sampling
from rlft.stages import common, inputs, policy_data
from rlft.stages.reward import reward_loss
from rlft.trainer import Trainer


def rm_records(env, ro) -> list[dict]:
    """What the reward model needs from a scored rollout: the text, its row and the environment's verdict."""
    verdicts = env.scores(ro.rows, ro.completions)
    return [{"prompt": row["prompt"], "prompt_text": prompt_text, "completion": text, "row": row,
             "correct": bool(v.correct)}
            for row, text, prompt_text, v in zip(ro.rows, ro.completions, ro.prompt_texts, verdicts)]


def hard_step_labels(it: "Iterations", record: dict) -> list[int]:
    """Hard label of each step of one completion: the environment's exact labels
    (`iterative.step_labels=exact`) or the Math-Shepherd estimate with the current policy (mc)."""
    steps, _ = split_steps(record["completion"])
    if it.cfg.iterative.step_labels == "exact":
        return it.experience.env.step_labels(record["row"], steps)
    if record["correct"]:
        return [1] * len(steps)
    prefixes = L.step_prefixes(steps)
    n = it.cfg.iterative.label_completions
    prompt_ids = [encode_prompt(it.experience.tokenizer, record["prompt_text"] + p) for p in prefixes]
    gens = it.experience.episodes([record["row"]] * len(prefixes), prompt_ids, n, Sampling.of_rollout(it.cfg.rollout),
                                  seed=len(record["completion"]) * 7919 + it.ctx.info.rank)
    hard, _ = L.mc_step_labels([gens.texts[j * n:(j + 1) * n] for j in range(len(prefixes))], prefixes,
                               lambda text: it.experience.env.score(record["row"], text).correct)
    return hard


def new_rows(it: "Iterations", kind: str, records: list[dict]) -> list[dict]:
    """The reward model's text rows from one iteration's samples: RM (correct, incorrect) pairs of one
    prompt; PRM solutions with hard step labels: the newest `label_budget` incorrect ones and as many
    of the newest correct ones."""
    if kind == "rm":
        return L.outcome_pairs(records, it.cfg.rollout.samples_per_prompt)
    # the newest samples: those of the policy that the next iteration continues from
    budget = it.cfg.iterative.label_budget
    wrong = [r for r in records if not r["correct"]][-budget:] if budget else []
    correct = [r for r in records if r["correct"]][-(len(wrong) or budget):] if budget else []
    rows = []
    for r in correct + wrong:
        steps, _ = split_steps(r["completion"])
        if steps:
            rows.append({"prompt_text": r["prompt_text"], "steps": steps, "labels": hard_step_labels(it, r)})
    return rows


def history_rows(it: "Iterations", kind: str, scorer, done: int) -> list[dict] | None:
    """The reward model's earlier training rows: those its stage trained on (kept beside its final/ when
    they were policy samples) and those each iteration before `done` added; None when its stage kept none
    (it trained on the data's own rows, which are re-read instead)."""
    first = policy_data.train_data_file(scorer.path)
    if not first.is_file():
        return None
    rows = policy_data.load_rows(first)
    for j in range(done):
        added = policy_data.train_data_file(it.ctx.run_dir / "iterations" / f"iter-{j}" / kind)
        if added.is_file():
            rows += policy_data.load_rows(added)
    return rows


def replay_examples(it: "Iterations", kind: str, scorer, num_new: int, done: int, seed: int) -> list[dict]:
    """Earlier training data of the reward model, sized to `iterative.replay_ratio` of the mix."""
    ratio = it.cfg.iterative.replay_ratio
    if ratio <= 0 or num_new == 0:
        return []
    count = max(1, round(num_new * ratio / (1.0 - ratio)))
    history = history_rows(it, kind, scorer, done)
    if history is None:
        tok = scorer.tokenizer
        data = inputs.pair_examples(it.cfg, tok, "train") if kind == "rm" else \
            inputs.step_examples(it.cfg, tok, "train", 0.5)
        return random.Random(seed).sample(data, min(len(data), count))
    rows = random.Random(seed).sample(history, min(len(history), count))
    return policy_data.encode_rows(kind, scorer.tokenizer, rows, it.cfg.train.max_seq_len)


def rm_train_config(cfg):
    """The policy's config with the reward model's batch, steps and learning rate."""
    rm_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    world = cfg.deepspeed.nproc_per_node * cfg.deepspeed.nnodes
    micro = cfg.train.micro_batch_per_device
    rm_cfg.train.batch_size = micro * world
    rm_cfg.train.max_steps = cfg.iterative.rm_steps
    rm_cfg.train.lr = cfg.iterative.rm_lr
    rm_cfg.train.warmup_steps = 0
    rm_cfg.train.lr_schedule = "constant"
    # The scorer is a whole module on every rank between retrainings (it scores each rank's samples);
    # ZeRO-3 would partition it, so a ZeRO-3 run trains it under ZeRO-2 (its optimizer state and
    # gradients still sharded).
    rm_cfg.deepspeed.zero_stage = min(cfg.deepspeed.zero_stage, 2)
    return rm_cfg


def trained_good_step_weight(path: str) -> float:
    """The algo.good_step_weight a PRM stage was trained with, from the config.yaml beside its final/ (1.0 for a
    PRM from elsewhere): its retraining on the policy's samples weighs correct steps as it did."""
    recorded = stage_config(Path(path).parent) if Path(path).name == "final" else None
    return 1.0 if recorded is None else float(OmegaConf.select(recorded, "algo.good_step_weight", default=1.0))


def train_reward_model(it: "Iterations", kind: str, scorer, examples: list[dict]) -> dict:
    """A few optimizer steps of the RM/PRM loss on `examples`; the scorer gets the new weights."""
    rm_cfg = rm_train_config(it.cfg)
    pad = scorer.tokenizer.pad_token_id
    loss_fn, count = reward_loss(kind, trained_good_step_weight(scorer.path) if kind == "prm" else 1.0)
    scorer.model.requires_grad_(True)
    trainer = Trainer(rm_cfg, scorer.model)
    losses = []
    for step in range(rm_cfg.train.max_steps):
        sums = common.Sums()
        common.optimizer_step(trainer, examples,
                              common.step_indices(step, rm_cfg.train.batch_size, len(examples), it.cfg.seed + 17),
                              count, functools.partial(loss_fn, pad_id=pad), rm_cfg.train, sums)
        losses.append(sums.reduce()["loss"])
    scorer.use(trainer.module)
    return {f"{kind}_retrain_loss_first": losses[0] if losses else float("nan"),
            f"{kind}_retrain_loss_last": losses[-1] if losses else float("nan"),
            f"{kind}_retrain_examples": len(examples)}


class Iterations:
    """The iterations of one RL run: the samples each collects, and what closes it (the reward models
    retrained, the reference reset). It changes the experience step only through its interface
    (`Experience.scorers` and each scorer's `use`, `Experience.use_reference`)."""

    def __init__(self, cfg, ctx, experience, policy, load_reference):
        self.cfg, self.ctx, self.experience, self.policy = cfg, ctx, experience, policy
        self.load_reference = load_reference  # path -> a frozen model
        self.count = cfg.iterative.iterations
        steps_per_rollout = cfg.algo.updates_per_rollout * cfg.algo.minibatches_per_rollout
        self.rollouts_per_iteration = cfg.train.max_steps // steps_per_rollout // self.count
        self.samples: list[dict] = []  # this iteration's scored samples (what the reward models retrain on)

    def index(self, rollout_index: int) -> int:
        return rollout_index // self.rollouts_per_iteration

    def starts(self, rollout_index: int) -> bool:
        """Whether rollout `rollout_index` opens an iteration after the first."""
        return self.count > 1 and rollout_index > 0 and rollout_index % self.rollouts_per_iteration == 0

    def record(self, ro) -> None:
        if self.count > 1:
            self.samples.extend(rm_records(self.experience.env, ro))

    def state(self) -> dict:
        """What a checkpoint carries: this iteration's samples so far."""
        return {"samples_log": self.samples} if self.count > 1 else {}

    def reset_reference(self, root) -> bool:
        if self.experience.reference is None or not self.cfg.iterative.reset_reference:
            return False
        self.experience.use_reference(self.load_reference(str(root / "policy")))
        return True

    def restore(self, last_rollout: int, samples_log: list[dict]) -> None:
        """Resume after rollout `last_rollout`: the reward models retrained and the reference reset at
        the end of the previous iteration (as saved then), and this iteration's samples so far."""
        iteration = self.index(last_rollout)
        self.samples = list(samples_log)
        if iteration < 1:
            return
        root = self.ctx.run_dir / "iterations" / f"iter-{iteration - 1}"
        for kind, scorer in self.experience.scorers().items():
            if (root / kind).is_dir():  # absent when that iteration had no data for it (unchanged)
                scorer.use(load_model(self.cfg.model, str(root / kind), scorer.tokenizer, head=kind))
        self.reset_reference(root)
        dist.print0(f"[rlft] resumed in iteration {iteration}: reward models and reference from {root}")

    def next(self, rollout_index: int) -> dict:
        """Close the iteration before the one rollout `rollout_index` opens: save the policy, retrain the
        reward models, reset the reference."""
        done = self.index(rollout_index) - 1
        root = self.ctx.run_dir / "iterations" / f"iter-{done}"
        self.policy.export_hf(root / "policy", self.experience.tokenizer)
        report = {}
        for kind, scorer in self.experience.scorers().items():
            rows = new_rows(self, kind, self.samples)
            examples = policy_data.encode_rows(kind, scorer.tokenizer, rows, self.cfg.train.max_seq_len)
            replay = replay_examples(self, kind, scorer, len(examples), done, self.cfg.seed + done + 1)
            report[f"{kind}_replay_examples"] = len(replay)
            examples += replay
            if not examples:
                dist.print0(f"iteration {done}: no {kind} training data from policy samples; {kind} unchanged")
                continue
            report.update(train_reward_model(self, kind, scorer, examples))
            every_rank = policy_data.gathered(rows)  # the history a later iteration replays
            if self.ctx.info.is_main:
                state = {k: v.detach().cpu() for k, v in scorer.model.state_dict().items()}
                save_hf_dir(scorer.model, state, scorer.tokenizer, root / kind)
                policy_data.save_rows(policy_data.train_data_file(root / kind), [{"row": r} for r in every_rank])
            dist.barrier()
        if self.reset_reference(root):
            report["reference"] = str(root / "policy")
        self.samples = []
        dist.print0(f"[rlft] iteration {done} done: {report}")
        return report
