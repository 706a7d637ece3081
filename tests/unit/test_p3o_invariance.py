"""P3O's motivating property (docs/algorithms.md §10, Thm. 2): adding a per-prompt constant to the
rewards leaves the P3O update unchanged, while PPO's update (GAE against a critic) changes.

Both updates run through the RL loop's own functions (pair_rollout_inputs + update_pairwise,
ADVANTAGES['gae'] + update_policy) on a fixed rollout, with a tiny model under plain SGD."""
import copy
from types import SimpleNamespace

import pytest
import torch

from rlft.algos import ADVANTAGES, AdvantageInputs, pair_rollout_inputs
from rlft.data.tokenizer import build_char_tokenizer
from rlft.models import load_model
from rlft.rollout import batch as rb
from rlft.rollout.logprobs import selective_logp
from rlft.stages import update as up
from rlft.stages.common import Sums
from rlft.stages.experience import advantage_config
from test_rl_parts import one_rank  # noqa: F401  (a world-size-1 process group)

PROMPTS = ["Q: 2+3?\nA:\n", "Q: 7-4?\nA:\n"]
COMPLETIONS = ["2+3=5\n#### 5", "2+3=6\n#### 6", "7-4=3\n#### 3", "7-4=2\n#### 2"]  # G=2 per prompt
SCORES = [1.0, 0.0, 1.0, 0.0]
SHIFT = [5.0, 5.0, -3.0, -3.0]  # a different constant for each prompt


class SGDEngine:
    """The slice of rlft.trainer.Trainer the update functions use, over a plain module and SGD."""

    def __init__(self, model):
        self.module, self.device = model, torch.device("cpu")
        self.opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def __call__(self, **kwargs):
        return self.module(**kwargs)

    def backward(self, loss, last):
        loss.backward()

    def step(self):
        self.opt.step()
        self.opt.zero_grad()


def rollout(tok, model, scores):
    prompt_ids = [tok(PROMPTS[i // 2], add_special_tokens=False)["input_ids"] for i in range(4)]
    comp_ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in COMPLETIONS]
    ids, attn, mask = rb.build_sequences(prompt_ids, comp_ids, tok.pad_token_id)
    ro = rb.Rollout(rows=[{}] * 4, prompt_texts=[""] * 4, completions=COMPLETIONS, completion_ids=comp_ids,
                    input_ids=ids, attention_mask=attn, mask=mask, truncated=torch.zeros(4, dtype=torch.bool),
                    prompt_lens=[len(p) for p in prompt_ids], scores=torch.tensor(scores, dtype=torch.float64))
    with torch.no_grad():
        logp = selective_logp(model(input_ids=ids, attention_mask=attn).logits[:, :-1], ids[:, 1:])
    ro.put(old_logp=logp, ref_logp=logp - 0.05)  # a reference that differs, so the KL terms are not zero
    return ro


def algo(**over):
    base = dict(pairwise_loss="p3o_joint", length_normalize=False, beta=0.1, clip_eps_low=0.2, clip_eps_high=0.2,
                dual_clip_c=None, c=10.0, kl_at="old", avg_tokenwise=False, updates_per_rollout=1,
                minibatches_per_rollout=1, max_new_tokens=16, samples_per_prompt=2,
                temperature=1.0, policy_loss="ppo_clip", loss_agg="token-mean", kl_estimator="k1", kl_in="reward",
                kl_coef=0.1, eps_adv=1e-4, std_unbiased=True, scale_by_std=True, rft_threshold=0.5, outcome_weight=0.0,
                distill_coef=1.0, gamma=1.0,
                lam=0.95, whiten_advantages=False, whiten_rewards=False, whiten_unbiased=True)
    return SimpleNamespace(**{**base, **over})


def weights_after(update, tok, base_model, scores, **over):
    model = copy.deepcopy(base_model)
    engine = SGDEngine(model)
    ro = rollout(tok, model, scores)
    update(engine, ro, algo(**over))  # the namespace serves as the algo, rollout, pairwise and critic sections
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def p3o_update(engine, ro, a):
    scores, s_ref, delta = pair_rollout_inputs(ro.scores, ro.get("old_logp"), ro.get("ref_logp"), ro.mask, 2, a.kl_coef)
    ro.put(pair_scores=scores, pair_s_ref=s_ref, delta=delta)
    up.update_pairwise(engine, ro, Sums(), up.Shape(a, 2, 1.0, 16, 4), a, a.kl_coef)


def ppo_update(engine, ro, a):
    ro.put(values=torch.full_like(ro.mask, 0.3))  # a fixed critic
    out = ADVANTAGES.get("gae")(AdvantageInputs(scores=ro.scores, mask=ro.mask, old_logp=ro.get("old_logp"),
                                                ref_logp=ro.get("ref_logp"), values=ro.get("values")),
                                advantage_config(a, a, a.kl_coef))
    ro.put(adv=out.adv.float(), returns=out.returns)
    up.update_policy(engine, ro, Sums(), up.Shape(a, 2, 1.0, 16, 4), a.kl_coef)


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer()
    cfg = SimpleNamespace(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, max_position_embeddings=64,
                          tie_embeddings=True, trust_remote_code=False)
    return tok, load_model(cfg, "builtin:tiny", tok, seed=0)


@pytest.mark.parametrize("mode", ["joint", "separate", "separate_tokenwise"])
def test_p3o_update_ignores_per_prompt_reward_shifts(one_rank, setup, mode):  # noqa: F811
    tok, model = setup
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    plain = weights_after(p3o_update, tok, model, SCORES, pairwise_loss=f"p3o_{mode}")
    shifted = weights_after(p3o_update, tok, model, [s + d for s, d in zip(SCORES, SHIFT)], pairwise_loss=f"p3o_{mode}")
    assert (plain - start).abs().max() > 1e-4  # the update did something
    assert torch.allclose(plain, shifted, atol=1e-7, rtol=0)


def test_ppo_update_changes_with_per_prompt_reward_shifts(one_rank, setup):  # noqa: F811
    tok, model = setup
    plain = weights_after(ppo_update, tok, model, SCORES)
    shifted = weights_after(ppo_update, tok, model, [s + d for s, d in zip(SCORES, SHIFT)])
    assert (plain - shifted).abs().max() > 1e-3
