"""liger-kernel's fused linear losses in place of rlft's own chunked head loss (train.fused_loss=liger).

Both compute a training loss from the final hidden states and the LM head's weight without the micro-batch's
logits (docs/performance.md, "liger-kernel's fused losses"). rlft's own (`lm_head.head_loss`) runs the head once
per chunk of tokens and differentiates the chunk at once; liger's
- RL update: `LigerFusedLinearGRPOLoss` (pure PyTorch, any device): the PPO clipped surrogate with the k3 KL in
  the loss, each chunk's log-probs an online log-sum-exp over 4,096-entry slices of the vocabulary, recomputed in
  the chunk's backward, which runs in the forward;
- SFT and RFT: `LigerFusedLinearCrossEntropyLoss`, a Triton kernel (a GPU; TRITON_INTERPRET=1 runs it on the
  CPU, slowly, which is how the tests check it).

rlft hands liger each response token as a row of its own ([N, 1, H]), so an advantage may differ from token to
token (process supervision, GAE), and the update's aggregation weights (`update.aggregation_weights`) go in as
liger's per-token mask, with its "dapo" normaliser set to 1: the loss is sum_t w_t (l_t + beta k3_t), the same
sum rlft's own path differentiates. The log-probs, entropies and metrics the run logs come from rlft's chunked
head without grad (one more forward of the head: liger returns the loss alone).

What liger's losses do not express is refused before the engine starts (`check_config`) or at the first forward
(`linear_head`): a policy loss other than ppo_clip, dual clip, a KL estimator other than k3 in the loss, top-k
or top-p sampling (liger's log-probs are of the full softmax), a full-distribution teacher term, a model that
processes its logits after the head (soft-capping, scaling), a LoRA-adapted head, ZeRO-3 (it reads the head's
weight outside the head's forward). Where rlft clamps (log-ratio to +-20 before exp, k3 to +-10) liger does
not; the two agree wherever no clamp acts.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from rlft.errors import ConfigError

INSTALL = "pip install liger-kernel (or train.fused_loss=rlft)"


def check_config(cfg) -> None:
    """One-line errors, before anything starts, for a run that asks for liger's loss where it cannot serve."""
    from rlft.config.algorithms import algo_spec
    from rlft.config.arithmetic import distill_sampled, uses_teacher

    try:
        import liger_kernel.chunked_loss  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"train.fused_loss=liger needs liger-kernel ({err}): {INSTALL}") from None
    spec, algo, train = algo_spec(cfg.algo), cfg.algo, cfg.train
    if train.logit_chunk_tokens == 0:
        raise ConfigError("train.fused_loss=liger computes the loss from the final hidden states: it cannot run with "
                          "train.logit_chunk_tokens=0 (the model's own logits); drop one of the two")
    if cfg.deepspeed.zero_stage == 3:
        raise ConfigError("train.fused_loss=liger reads the LM head's weight outside the head's forward, where "
                          "ZeRO-3 keeps it partitioned: use deepspeed.zero_stage <= 2 or train.fused_loss=rlft")
    if spec.stage in ("sft:run", "rft:run"):
        if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
            raise ConfigError("train.fused_loss=liger trains SFT/RFT with liger's fused cross-entropy, a Triton "
                              "kernel that needs a GPU (TRITON_INTERPRET=1 runs it on the CPU, slowly): "
                              "use train.fused_loss=rlft here")
        return
    if not spec.rl or algo.pairwise_loss is not None:
        raise ConfigError(f"train.fused_loss=liger serves SFT, RFT and the per-token RL update; algo {algo.name} "
                          "trains another loss: use train.fused_loss=rlft")
    if algo.policy_loss != "ppo_clip" or algo.dual_clip_c is not None:
        raise ConfigError(f"train.fused_loss=liger computes the PPO clipped surrogate without dual clip; algo."
                          f"policy_loss={algo.policy_loss} dual_clip_c={algo.dual_clip_c}: use train.fused_loss=rlft")
    if str(algo.kl_in) == "loss" and algo.kl_estimator != "k3" and float(algo.kl_coef) != 0.0:
        raise ConfigError(f"train.fused_loss=liger puts the k3 KL in the loss; algo.kl_estimator="
                          f"{algo.kl_estimator}: set algo.kl_estimator=k3 or train.fused_loss=rlft")
    if int(cfg.rollout.top_k) > 0 or float(cfg.rollout.top_p) < 1.0:
        raise ConfigError("train.fused_loss=liger computes log-probs of the full softmax, but rollout.top_k/top_p "
                          "sample from a truncated one: use train.fused_loss=rlft (its log-probs replay the "
                          "truncation) or sample without top-k/top-p")
    if uses_teacher(cfg) and not distill_sampled(algo):
        raise ConfigError(f"train.fused_loss=liger has no full-distribution teacher term (algo.distill_divergence="
                          f"{algo.distill_divergence}): use train.fused_loss=rlft")


def linear_head(inner) -> torch.nn.Linear:
    """The LM head of a transformers model (lm_head.unwrap's) when liger's losses can read it: a plain linear layer
    (tied or not, trainable or frozen) whose output is the model's logits (a one-line ConfigError otherwise)."""
    head = inner.get_output_embeddings()
    if type(head) is not torch.nn.Linear or any(hasattr(p, "ds_id") for p in head.parameters()):
        raise ConfigError(f"train.fused_loss=liger needs a plain linear LM head; {type(inner).__name__}'s is "
                          f"{type(head).__name__} (a LoRA-adapted or ZeRO-3 head): use train.fused_loss=rlft")
    config = inner.config
    if any(getattr(config, key, None) is not None for key in ("final_logit_softcapping", "logit_scale",
                                                              "logits_scaling")):
        raise ConfigError(f"{type(inner).__name__} processes its logits after the LM head (soft-capping or "
                          "scaling), which liger's losses do not: use train.fused_loss=rlft")
    return head


def world_size() -> int:
    ready = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if ready else 1


def policy_kernel(clip_eps_low: float, clip_eps_high: float, kl_coef: float, temperature: float,
                  chunk_tokens: int) -> Callable:
    """The RL update's loss through `LigerFusedLinearGRPOLoss`: kernel(head, hidden [N, H], targets [N], inputs
    {adv, weight[, old, ref, is_weight]: [N]}) -> sum_t weight_t (ppo_clip_t * is_weight_t + kl_coef k3_t), with
    grad to the hidden states and the head. `kl_coef` 0: no KL term (and no reference read)."""
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    loss = LigerFusedLinearGRPOLoss(beta=kl_coef, compiled=False, use_ref_model=kl_coef != 0.0,
                                    chunk_size=max(1, chunk_tokens), epsilon_low=clip_eps_low,
                                    epsilon_high=clip_eps_high, loss_type="dapo", temperature=temperature)

    def kernel(head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor, inputs: dict) -> torch.Tensor:
        def column(name):
            return inputs[name][:, None] if name in inputs else None
        value, _metrics = loss(hidden[:, None], head.weight, targets[:, None], column("weight"), inputs["adv"],
                               head.bias, ref_per_token_logps=column("ref") if kl_coef != 0.0 else None,
                               old_per_token_logps=column("old"), vllm_is_ratio=column("is_weight"),
                               num_items_in_batch=world_size())  # liger's normaliser: num_items / world = 1
        return value
    return kernel


def nll_kernel() -> Callable:
    """SFT's loss through `LigerFusedLinearCrossEntropyLoss`: kernel(head, hidden [N, H], targets [N], {"weight":
    [N]}) -> sum_t weight_t (-log p_t). SFT weighs every token alike (1 / the step's token count)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss(reduction="sum")

    def kernel(head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor, inputs: dict) -> torch.Tensor:
        weight = inputs["weight"]
        if not torch.equal(weight.amin(), weight.amax()):
            raise ValueError("liger's cross-entropy takes one weight for every token")
        return loss(head.weight, hidden, targets, head.bias) * weight[0]
    return kernel
