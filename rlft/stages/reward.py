"""Reward models: the outcome RM (Bradley-Terry on preference pairs) and the process RM.

    rlft train algo=rm  run.name=demo     # starts from this run's SFT checkpoint
    rlft train algo=prm run.name=demo

RM (docs/algorithms.md §2): a scalar head reads the last real token of prompt + response;
loss = -log sigmoid(r_chosen - r_rejected), averaged over the pairs of the optimizer step.
PRM (§2.2): the same head read at the last token of every reasoning step; loss = binary
cross-entropy against the step labels, averaged over the steps of the optimizer step.
Both report held-out accuracy: pairwise (chosen scored higher) and per step (p > 0.5).
For the built-in task the pairs and step labels are generated (correct vs corrupted solutions).
"""
from __future__ import annotations

import functools

import torch

from rlft import dist
from rlft.algos.preference import bradley_terry_loss, prm_bce_loss
from rlft.data.encode import collate_padded, pad_to
from rlft.model_source import resolve_model_path
from rlft.models import last_token_index, load_model, load_tokenizer, token_scores
from rlft.stages import common, inputs, policy_data
from rlft.trainer import Trainer


def pair_scores(trainer: Trainer, examples: list[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen [N], r_rejected [N]): one forward over chosen and rejected sequences together."""
    seqs = [ex["chosen_ids"] for ex in examples] + [ex["rejected_ids"] for ex in examples]
    ids, attn = collate_padded(seqs, pad_id)
    ids, attn = ids.to(trainer.device), attn.to(trainer.device)
    scores = token_scores(trainer.module, ids, attn)
    last = scores.gather(1, last_token_index(attn)[:, None]).squeeze(1)
    return last[:len(examples)], last[len(examples):]


def rm_loss(trainer: Trainer, examples: list[dict], num_pairs_global: float, pad_id: int):
    r_w, r_l = pair_scores(trainer, examples, pad_id)
    loss = bradley_terry_loss(r_w, r_l)
    n = float(len(examples))
    stats = {"loss": (loss.sum().item(), n), "pair_acc": ((r_w > r_l).float().sum().item(), n),
             "margin": ((r_w - r_l).sum().item(), n)}
    return loss.sum() / num_pairs_global, stats


def step_logits(trainer: Trainer, examples: list[dict], pad_id: int):
    """(logits [N, S], labels [N, S], mask [N, S]) at each step's last token."""
    ids, attn = collate_padded([ex["input_ids"] for ex in examples], pad_id)
    scores = token_scores(trainer.module, ids.to(trainer.device), attn.to(trainer.device))
    positions = pad_to([ex["step_positions"] for ex in examples], 0).to(trainer.device)
    labels = pad_to([ex["step_labels"] for ex in examples], 0).to(trainer.device)
    mask = pad_to([[1] * len(ex["step_positions"]) for ex in examples], 0).to(trainer.device)
    return scores.gather(1, positions), labels, mask


def prm_loss(trainer: Trainer, examples: list[dict], num_steps_global: float, pad_id: int, good_weight: float = 1.0):
    logits, labels, mask = step_logits(trainer, examples, pad_id)
    per_solution = prm_bce_loss(logits, labels, mask, reduction="sum", good_weight=good_weight)
    n_steps = mask.sum().item()
    correct = (((logits > 0).long() == labels).float() * mask).sum().item()
    # a solution is judged correct when its weakest step is (min over steps, §2.2)
    solution_ok = torch.where(mask.bool(), logits, torch.full_like(logits, float("inf"))).min(-1).values > 0
    solution_gold = torch.where(mask.bool(), labels, torch.ones_like(labels)).min(-1).values.bool()
    hit = ((logits > 0).long() == labels).float() * mask
    good, bad = labels.float() * mask, (1 - labels.float()) * mask
    # per class, so that a skewed label mix cannot hide behind step_acc (their mean: balanced accuracy)
    stats = {"loss": (per_solution.sum().item(), n_steps), "step_acc": (correct, n_steps),
             "step_acc_good": ((hit * good).sum().item(), good.sum().item()),
             "step_acc_bad": ((hit * bad).sum().item(), bad.sum().item()),
             "step_label_mean": (good.sum().item(), n_steps),
             "solution_acc": ((solution_ok == solution_gold).float().sum().item(), float(len(examples)))}
    return per_solution.sum() / num_steps_global, stats


def solution_pair_accuracy(trainer: Trainer, examples: list[dict], pad_id: int, micro: int) -> dict:
    """The PRM as an outcome verifier: its solution score (the minimum step logit, §2.2) of a correct sample
    against an incorrect sample of the same question, paired in order within each question as the RM's
    pairs are. Every rank scores every example (the same forwards on each rank, as ZeRO-3 requires)."""
    scores: list[float] = []
    with trainer.evaluating():
        for i in range(0, len(examples), micro):
            logits, _, mask = step_logits(trainer, examples[i:i + micro], pad_id)
            scores += torch.where(mask.bool(), logits, torch.full_like(logits, float("inf"))).min(-1).values.tolist()
    return paired_accuracy([ex["question"] for ex in examples], [ex["correct"] for ex in examples], scores)


def paired_accuracy(questions: list[str], correct: list[bool], scores: list[float]) -> dict:
    """{eval_pair_acc}: the share of (correct, incorrect) pairs of one question, paired in order, that the
    scores rank right (empty when no question has both)."""
    by_question: dict[str, tuple[list, list]] = {}
    for q, ok, score in zip(questions, correct, scores):
        by_question.setdefault(q, ([], []))[0 if ok else 1].append(score)
    pairs = [(w, lose) for good, bad in by_question.values() for w, lose in zip(good, bad)]
    return {"eval_pair_acc": sum(w > lose for w, lose in pairs) / len(pairs)} if pairs else {}


def step_count(examples: list[dict]) -> int:
    """Labelled steps in a batch of step-labelled solutions (the PRM loss's global normaliser)."""
    return sum(len(ex["step_positions"]) for ex in examples)


def reward_loss(kind: str, good_step_weight: float = 1.0):
    """(loss function, the global count it is normalised by) of an RM or a PRM (`good_step_weight`: the PRM's
    weight of correct steps): one definition for the reward stages and the iterative retraining."""
    if kind == "rm":
        return rm_loss, len
    return functools.partial(prm_loss, good_weight=good_step_weight), step_count


def run_rm(cfg, ctx: common.StageContext) -> dict:
    """Train an outcome RM (algo=rm) on preference pairs: the data's, or pairs of the policy's samples."""
    algo = cfg.algo
    if algo.source == "policy":
        return run(cfg, ctx, "rm", lambda tok, split: policy_data.pair_examples(
            cfg, tok, split, algo.num_prompts if split == "train" else algo.num_eval_pairs, ctx.info.device),
            len, rm_loss)
    return run(cfg, ctx, "rm", lambda tok, split: (
        held(inputs.pair_examples(cfg, tok, split), split, algo.num_eval_pairs), {}), len, rm_loss)


def run_prm(cfg, ctx: common.StageContext) -> dict:
    """Train a process RM (algo=prm) on step-labelled solutions: the data's, or the policy's samples."""
    algo = cfg.algo
    loss, _ = reward_loss("prm", algo.good_step_weight)
    if algo.source == "policy":
        return run(cfg, ctx, "prm", lambda tok, split: policy_data.step_examples(
            cfg, tok, split, algo.num_prompts if split == "train" else algo.num_eval_rows, ctx.info.device),
            step_count, loss)
    return run(cfg, ctx, "prm", lambda tok, split: (
        held(inputs.step_examples(cfg, tok, split, algo.frac_correct), split, algo.num_eval_rows), {}),
        step_count, loss)


def held(examples: list, split: str, num_eval: int) -> list:
    """All training examples; the first num_eval held-out ones."""
    return examples if split == "train" else examples[:num_eval]


def run(cfg, ctx: common.StageContext, head: str, examples, count_fn, loss) -> dict:
    """Train a reward model with the `head` (rm: one score per sequence, prm: per step) on
    examples(tokenizer, split) -> (examples, data summary), the loss normalised by count_fn(global batch)."""
    common.prepare_run_dir(ctx)
    parent = resolve_model_path(cfg)
    tokenizer = load_tokenizer(cfg.model, parent)
    common.seed_everything(cfg.seed)
    (train, train_info), (test, test_info) = examples(tokenizer, "train"), examples(tokenizer, "test")
    if not train:
        raise common.StageError(f"{head}: no training examples (from {cfg.algo.source}); with algo.source=policy "
                                "the sampled model needs both correct and incorrect samples: raise "
                                "rollout.samples_per_prompt or algo.num_prompts")
    common.seed_everything(cfg.seed)
    model = load_model(cfg.model, parent, tokenizer, head=head, seed=cfg.seed, trained=True)
    pad = tokenizer.pad_token_id
    loss_fn = functools.partial(loss, pad_id=pad)
    dist.print0(f"{head}: {len(train)} training and {len(test)} held-out examples"
                + (f"; {train_info | test_info}" if train_info else ""))
    trainer = Trainer(cfg, model)
    micro = cfg.train.micro_batch_per_device

    def evaluate() -> dict:
        out = common.held_out(trainer, test, loss_fn, micro)
        if head == "prm" and "correct" in test[0]:  # policy samples: the PRM's solution scores, paired
            out.update(solution_pair_accuracy(trainer, test, pad, micro))
        return out

    summary = common.supervised_loop(ctx, trainer, train, count_fn, loss_fn, evaluate if test else None,
                                     cfg.algo.eval_every)
    summary.update(train_info, **test_info)
    if ctx.info.is_main:  # policy samples: the rows iterative RL replays (docs/algorithms.md §4)
        policy_data.save_rows(ctx.run_dir / policy_data.TRAIN_DATA, train)
    common.finish(ctx, trainer, tokenizer, parent, summary)
    return summary
