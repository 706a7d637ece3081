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

import random


from omegaconf import OmegaConf

from rlft.data import labels as L
from rlft.data.encode import encode_prompt
from rlft.engine import Engine, dist, save_hf_dir
from rlft.models import load_model
from rlft.rewards.scoring import split_steps
from rlft.rollout.generate import Sampling
from rlft.stages import common, inputs, policy_data
from rlft.stages.reward import prm_loss, rm_loss, step_count


def sample_records(stage, ro) -> list[dict]:
    """What the reward model needs from a scored rollout: the text, its row and the environment's verdict."""
    verdicts = stage.env.scores(ro.rows, ro.completions)
    return [{"prompt": row["prompt"], "prompt_text": prompt_text, "completion": text, "row": row,
             "correct": bool(v.correct)}
            for row, text, prompt_text, v in zip(ro.rows, ro.completions, ro.prompt_texts, verdicts)]


def hard_step_labels(stage, record: dict) -> list[int]:
    """Hard label of each step of one completion: the environment's exact labels
    (`iterative.step_labels=exact`) or the Math-Shepherd estimate with the current policy (mc)."""
    steps, _ = split_steps(record["completion"])
    if stage.cfg.iterative.step_labels == "exact":
        return stage.env.step_labels(record["row"], steps)
    if record["correct"]:
        return [1] * len(steps)
    prefixes = L.step_prefixes(steps)
    n = stage.cfg.iterative.label_completions
    r = stage.cfg.rollout
    prompt_ids = [encode_prompt(stage.tokenizer, record["prompt_text"] + p) for p in prefixes]
    gens = stage.episodes([record["row"]] * len(prefixes), prompt_ids, n,
                          Sampling(r.max_new_tokens, True, r.temperature, r.top_p, r.top_k),
                          seed=len(record["completion"]) * 7919 + stage.ctx.info.rank)
    hard, _ = L.mc_step_labels([gens.texts[j * n:(j + 1) * n] for j in range(len(prefixes))], prefixes,
                               lambda text: stage.env.score(record["row"], text).correct)
    return hard


def new_rows(stage, kind: str, records: list[dict]) -> list[dict]:
    """The reward model's text rows from one iteration's samples: RM (correct, incorrect) pairs of one
    prompt; PRM solutions with hard step labels: the newest `label_budget` incorrect ones and as many
    of the newest correct ones."""
    if kind == "rm":
        return L.outcome_pairs(records, stage.cfg.rollout.samples_per_prompt)
    # the newest samples: those of the policy that the next iteration continues from
    budget = stage.cfg.iterative.label_budget
    wrong = [r for r in records if not r["correct"]][-budget:] if budget else []
    correct = [r for r in records if r["correct"]][-(len(wrong) or budget):] if budget else []
    rows = []
    for r in correct + wrong:
        steps, _ = split_steps(r["completion"])
        if steps:
            rows.append({"prompt_text": r["prompt_text"], "steps": steps, "labels": hard_step_labels(stage, r)})
    return rows


def history_rows(stage, kind: str, scorer, done: int) -> list[dict] | None:
    """The reward model's earlier training rows: those its stage trained on (kept beside its final/ when
    they were policy samples) and those each iteration before `done` added; None when its stage kept none
    (it trained on the data's own rows, which are re-read instead)."""
    first = policy_data.train_data_file(scorer.path)
    if not first.is_file():
        return None
    rows = policy_data.load_rows(first)
    for j in range(done):
        added = policy_data.train_data_file(stage.ctx.run_dir / "iterations" / f"iter-{j}" / kind)
        if added.is_file():
            rows += policy_data.load_rows(added)
    return rows


def replay_examples(stage, kind: str, scorer, num_new: int, done: int, seed: int) -> list[dict]:
    """Earlier training data of the reward model, sized to `iterative.replay_ratio` of the mix."""
    ratio = stage.cfg.iterative.replay_ratio
    if ratio <= 0 or num_new == 0:
        return []
    count = max(1, round(num_new * ratio / (1.0 - ratio)))
    history = history_rows(stage, kind, scorer, done)
    if history is None:
        tok = scorer.tokenizer
        data = inputs.pair_examples(stage.cfg, tok, "train") if kind == "rm" else \
            inputs.step_examples(stage.cfg, tok, "train", 0.5)
        return random.Random(seed).sample(data, min(len(data), count))
    rows = random.Random(seed).sample(history, min(len(history), count))
    return policy_data.encode_rows(kind, scorer.tokenizer, rows, stage.cfg.train.max_seq_len)


def rm_train_config(cfg):
    """The policy's config with the reward model's batch, steps and learning rate."""
    rm_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    world = cfg.engine.nproc_per_node * cfg.engine.nnodes
    micro = cfg.train.micro_batch_per_device
    rm_cfg.train.batch_size = micro * world
    rm_cfg.train.max_steps = cfg.iterative.rm_steps
    rm_cfg.train.lr = cfg.iterative.rm_lr
    rm_cfg.train.warmup_steps = 0
    rm_cfg.train.lr_schedule = "constant"
    # The scorer is a whole module on every rank between retrainings (it scores each rank's samples);
    # ZeRO-3 would partition it, so a ZeRO-3 run trains it under ZeRO-2 (its optimizer state and
    # gradients still sharded).
    rm_cfg.engine.zero_stage = min(cfg.engine.zero_stage, 2)
    return rm_cfg


# kind -> (loss function, the global count it is normalised by)
LOSSES = {"rm": (rm_loss, len), "prm": (prm_loss, step_count)}


def train_reward_model(stage, kind: str, scorer, examples: list[dict]) -> dict:
    """A few optimizer steps of the RM/PRM loss on `examples`; the scorer gets the new weights."""
    rm_cfg = rm_train_config(stage.cfg)
    pad = scorer.tokenizer.pad_token_id
    loss_fn, count = LOSSES[kind]
    scorer.model.requires_grad_(True)
    engine = Engine(rm_cfg, scorer.model)
    losses = []
    for step in range(rm_cfg.train.max_steps):
        sums = common.Sums()
        common.optimizer_step(engine, examples,
                              common.step_indices(step, rm_cfg.train.batch_size, len(examples), stage.cfg.seed + 17),
                              count, lambda e, x, d: loss_fn(e, x, d, pad), rm_cfg.train, sums)
        losses.append(sums.reduce()["loss"])
    scorer.use(engine.module)
    return {f"{kind}_retrain_loss_first": losses[0] if losses else float("nan"),
            f"{kind}_retrain_loss_last": losses[-1] if losses else float("nan"),
            f"{kind}_retrain_examples": len(examples)}


def restore(stage, iteration: int, samples_log: list[dict]) -> None:
    """Resume inside `iteration`: the reward models retrained and the reference reset at the end of
    iteration - 1 (as saved then), and this iteration's samples so far."""
    stage.samples_log = list(samples_log)
    if iteration < 1:
        return
    root = stage.ctx.run_dir / "iterations" / f"iter-{iteration - 1}"
    scorers = dict(stage.rewards.models)
    if stage.step_prm is not None:
        scorers["prm"] = stage.step_prm
    for kind, scorer in scorers.items():
        if (root / kind).is_dir():  # absent when that iteration had no data for it (unchanged)
            scorer.use(load_model(stage.cfg.model, str(root / kind), scorer.tokenizer, head=kind))
    if stage.ref is not None and stage.cfg.iterative.reset_reference:
        stage.ref = stage.load_reference(str(root / "policy"))
    dist.print0(f"[rlft] resumed in iteration {iteration}: reward models and reference from {root}")


def next_iteration(stage, iteration: int) -> dict:
    """Close iteration `iteration - 1`: save, retrain reward models, reset the reference."""
    done = iteration - 1
    root = stage.ctx.run_dir / "iterations" / f"iter-{done}"
    stage.policy.export_hf(root / "policy", stage.tokenizer)
    report = {}
    scorers = dict(stage.rewards.models)
    if stage.step_prm is not None:
        scorers["prm"] = stage.step_prm
    for kind, scorer in scorers.items():
        rows = new_rows(stage, kind, stage.samples_log)
        examples = policy_data.encode_rows(kind, scorer.tokenizer, rows, stage.cfg.train.max_seq_len)
        replay = replay_examples(stage, kind, scorer, len(examples), done, stage.cfg.seed + iteration)
        report[f"{kind}_replay_examples"] = len(replay)
        examples += replay
        if not examples:
            dist.print0(f"iteration {done}: no {kind} training data from policy samples; {kind} unchanged")
            continue
        report.update(train_reward_model(stage, kind, scorer, examples))
        every_rank = policy_data.gathered(rows)  # the history a later iteration replays
        if stage.ctx.info.is_main:
            state = {k: v.detach().cpu() for k, v in scorer.model.state_dict().items()}
            save_hf_dir(scorer.model, state, scorer.tokenizer, root / kind)
            policy_data.save_rows(policy_data.train_data_file(root / kind), [{"row": r} for r in every_rank])
        dist.barrier()
    if stage.ref is not None and stage.cfg.iterative.reset_reference:
        stage.ref = stage.load_reference(str(root / "policy"))
        report["reference"] = str(root / "policy")
    stage.samples_log = []
    dist.print0(f"[rlft] iteration {done} done: {report}")
    return report
