"""Rollout tensors (rlft.rollout): sequences and the response mask, truncation policies, PRM
step columns, row concatenation, EOS cutting and chunked log-probs (docs/algorithms.md §0)."""
from __future__ import annotations

import pytest
import torch

from rlft.data.tokenizer import build_char_tokenizer
from rlft.rewards.scoring import split_steps
from rlft.rollout import batch as rb
from rlft.rollout.generate import cut_at_eos
from rlft.rollout.logprobs import batched_token_logp, selective_logp, token_logp

PAD, EOS = 0, 2


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


# ----------------------------------------------------------------------------- build_sequences
def test_build_sequences_mask_marks_exactly_the_completion_targets():
    prompts = [[10, 11, 12], [20], [30, 31]]
    completions = [[13, 14, EOS], [21, 22, 23, 24, 25], [EOS]]  # row 1 truncated (no EOS)
    ids, attn, mask = rb.build_sequences(prompts, completions, PAD)
    assert ids.tolist() == [[10, 11, 12, 13, 14, EOS],
                            [20, 21, 22, 23, 24, 25],
                            [30, 31, EOS, PAD, PAD, PAD]]
    assert attn.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]
    assert mask.shape == (3, 5) and mask.dtype == torch.float32
    # column p is 1 iff token p+1 is a completion token (EOS included, prompt and padding excluded)
    assert mask.tolist() == [[0, 0, 1, 1, 1],
                             [1, 1, 1, 1, 1],
                             [0, 1, 0, 0, 0]]
    for r, (p, c) in enumerate(zip(prompts, completions)):
        targets = ids[r, 1:]
        picked = targets[mask[r].bool()].tolist()
        assert picked == c, (r, picked, c)
        assert mask[r].sum().item() == len(c)


def test_build_sequences_pads_mask_to_the_widest_row():
    # the longest mask row can be shorter than L-1 when the longest sequence is mostly prompt
    ids, attn, mask = rb.build_sequences([[5, 6, 7, 8, 9], [5]], [[EOS], [6, EOS]], PAD)
    assert ids.shape == (2, 6) and mask.shape == (2, 5)
    assert mask.tolist() == [[0, 0, 0, 0, 1], [1, 1, 0, 0, 0]]


# ----------------------------------------------------------------------------- truncation policy
@pytest.fixture
def trunc_batch():
    scores = torch.tensor([1.0, 0.5, 0.0, 2.0], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.float32)
    truncated = torch.tensor([False, True, False, True])
    return scores, mask, truncated


@pytest.mark.parametrize("policy, want_scores, masked_rows", [
    ("keep", [1.0, 0.5, 0.0, 2.0], []),
    ("zero_reward", [1.0, 0.0, 0.0, 0.0], []),
    ("penalty", [1.0, 0.5 - 0.75, 0.0, 2.0 - 0.75], []),
    ("mask", [1.0, 0.5, 0.0, 2.0], [1, 3]),
])
def test_truncation_policies(trunc_batch, policy, want_scores, masked_rows):
    scores, mask, truncated = trunc_batch
    before = (scores.clone(), mask.clone())
    new_scores, new_mask = rb.apply_truncation_policy(scores, mask, truncated, policy, 0.75)
    assert new_scores.tolist() == pytest.approx(want_scores, abs=1e-12)
    for r in range(4):
        if r in masked_rows:
            assert new_mask[r].sum().item() == 0
        else:
            assert torch.equal(new_mask[r], mask[r])
    # inputs untouched
    assert torch.equal(scores, before[0]) and torch.equal(mask, before[1])


def test_unknown_truncation_policy_is_one_line_listing_valid(trunc_batch):
    with pytest.raises(ValueError) as exc:
        rb.apply_truncation_policy(*trunc_batch, "drop", 1.0)
    msg = str(exc.value)
    assert "\n" not in msg and "'drop'" in msg
    for name in ("keep", "zero_reward", "mask", "penalty"):
        assert name in msg


# ----------------------------------------------------------------------------- step columns
def test_step_columns_point_at_the_last_character_of_each_step(tok):
    prompt = "Q: 3+4-2?\nA:\n"
    completion = "3+4=7\n7-2=5\n#### 5"
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    comp_ids = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert len(prompt_ids) == len(prompt) and len(comp_ids) == len(completion) + 1
    steps, ends = split_steps(completion)
    assert steps == ["3+4=7", "7-2=5", "#### 5"] and ends == [5, 11, 18]
    cols = rb.step_columns(tok, comp_ids, ends, len(prompt_ids))
    # char tokenizer: step end e (exclusive) is completion token e-1, i.e. target column P + e - 2
    P = len(prompt)
    assert cols == [P + 3, P + 9, P + 16]
    ids, _, mask = rb.build_sequences([prompt_ids], [comp_ids], tok.pad_token_id)
    for col, step in zip(cols, steps):
        assert mask[0, col] == 1
        assert tok.decode([int(ids[0, col + 1])]) == step[-1]
        # the text up to and including that target is the completion up to the step end
        assert tok.decode(ids[0, P:col + 2].tolist()) == completion[:completion.index(step) + len(step)]


def test_step_columns_with_trailing_spaces_and_blank_lines(tok):
    completion = "a=1  \n\nb=2\n"
    steps, ends = split_steps(completion)
    assert steps == ["a=1", "b=2"] and ends == [3, 10]
    comp_ids = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    cols = rb.step_columns(tok, comp_ids, ends, prompt_len=4)
    assert cols == [4 - 1 + 2, 4 - 1 + 9]


# ----------------------------------------------------------------------------- concat_rows
def _rollout(prompts, comps, scores, per_source, truncated, step_ends=None):
    ids, attn, mask = rb.build_sequences(prompts, comps, PAD)
    n = len(comps)
    ro = rb.Rollout(rows=[{"prompt": f"p{i}", "answer": str(i)} for i in range(n)],
                    prompt_texts=[f"pt{i}" for i in range(n)], completions=[f"c{i}" for i in range(n)],
                    completion_ids=comps, input_ids=ids, attention_mask=attn, mask=mask,
                    truncated=torch.tensor(truncated), prompt_lens=[len(p) for p in prompts],
                    scores=torch.tensor(scores, dtype=torch.float64), per_source=per_source)
    if step_ends:
        ro.put(step_ends=step_ends, step_scores=[[0.5] * len(e) for e in step_ends])
    return ro


def test_concat_rows_keeps_rows_scores_and_masks():
    a = _rollout([[10, 11], [12]], [[13, EOS], [14, 15, 16]], [1.0, 0.0], {"correctness": [1.0, 0.0]},
                 [False, True], step_ends=[[2], [1, 3]])
    a.mask[1] = 0.0  # truncation_policy=mask dropped row 1
    b = _rollout([[20, 21, 22, 23]], [[24, 25, 26, 27, 28, EOS]], [0.25], {"correctness": [0.25]}, [False],
                 step_ends=[[7]])
    out = rb.concat_rows([(b, 0), (a, 1), (a, 0)], PAD)
    assert len(out) == 3
    assert out.completions == ["c0", "c1", "c0"]
    assert [r["prompt"] for r in out.rows] == ["p0", "p1", "p0"]
    assert out.scores.tolist() == [0.25, 0.0, 1.0] and out.scores.dtype == torch.float64
    assert out.per_source == {"correctness": [0.25, 0.0, 1.0]}
    assert out.truncated.tolist() == [False, True, False]
    assert out.prompt_lens == [4, 1, 2]
    assert out.get("step_ends") == [[7], [1, 3], [2]]
    assert out.get("step_scores") == [[0.5], [0.5, 0.5], [0.5]]
    assert out.input_ids.shape == (3, 10)
    assert out.input_ids[0].tolist() == [20, 21, 22, 23, 24, 25, 26, 27, 28, EOS]
    assert out.input_ids[2].tolist() == [10, 11, 13, EOS] + [PAD] * 6
    # masks: rebuilt for the new width, the policy-zeroed row stays zero
    assert out.mask.shape == (3, 9)
    assert out.mask[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert out.mask[1].sum().item() == 0
    assert out.mask[2].tolist() == [0, 1, 1, 0, 0, 0, 0, 0, 0]


# ----------------------------------------------------------------------------- cut_at_eos
@pytest.mark.parametrize("tokens, eos, pad, want", [
    ([5, 6, EOS, 7, EOS], EOS, PAD, ([5, 6, EOS], False)),     # first EOS kept, rest dropped
    ([EOS, PAD, PAD], EOS, PAD, ([EOS], False)),
    ([5, 6, 7], EOS, PAD, ([5, 6, 7], True)),                  # no EOS within max_new_tokens
    ([5, 6, PAD, PAD], EOS, PAD, ([5, 6], True)),              # trailing padding removed
    ([5, PAD, 6], EOS, PAD, ([5, PAD, 6], True)),              # only trailing padding
    ([5, 6, EOS, EOS], EOS, EOS, ([5, 6, EOS], False)),        # pad == eos: first EOS ends it
    ([], EOS, PAD, ([], True)),
])
def test_cut_at_eos(tokens, eos, pad, want):
    assert cut_at_eos(list(tokens), eos, pad) == want


# ----------------------------------------------------------------------------- log-probs
def test_selective_logp_equals_log_softmax_gather_in_float64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 5, 33, generator=g) * 4
    targets = torch.randint(0, 33, (7, 5), generator=g)
    ref = torch.log_softmax(logits.double(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    got = selective_logp(logits, targets)
    assert got.dtype == torch.float32 and got.shape == (7, 5)
    assert (got.double() - ref).abs().max().item() < 1e-5
    # chunking never changes a row's value
    for chunk in (1, 2, 3, 7, 100):
        assert torch.equal(selective_logp(logits, targets, rows_per_chunk=chunk), got)


def test_log_prob_chunks_hold_as_many_rows_as_fit_the_budget():
    from rlft.rollout.logprobs import CHUNK_BYTES, chunk_rows

    assert chunk_rows(torch.zeros(64, 128, 128)) >= 64  # a small vocabulary: the batch in one piece
    row = torch.zeros(1, 256, 151936)  # a Qwen-sized vocabulary at 256 tokens: 156 MB per row in fp32
    assert chunk_rows(row.expand(8, -1, -1)) == CHUNK_BYTES // (256 * 151936 * 4) == 3
    assert chunk_rows(torch.zeros(2, 1, CHUNK_BYTES)) == 1  # never fewer than one row


def test_selective_logp_upcasts_low_precision_logits():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 4, 17, generator=g) * 3).to(torch.bfloat16)
    targets = torch.randint(0, 17, (3, 4), generator=g)
    ref = torch.log_softmax(logits.double(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    got = selective_logp(logits, targets, rows_per_chunk=2)
    assert got.dtype == torch.float32
    assert (got.double() - ref).abs().max().item() < 1e-5


def test_token_logp_is_target_aligned_and_micro_batching_is_exact(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=64, pad_token_id=0)).eval()
    ids, attn, mask = rb.build_sequences([[5, 6, 7], [8], [9, 10]], [[11, 12, EOS], [13, EOS], [14, 15, 16, 17]],
                                         PAD)
    with torch.no_grad():
        logp = token_logp(model, ids, attn, temperature=0.7)
        logits = model(input_ids=ids, attention_mask=attn).logits.double() / 0.7
    ref = torch.log_softmax(logits, -1)
    for r in range(3):
        for p in range(ids.shape[1] - 1):
            if attn[r, p + 1]:
                assert abs(logp[r, p].item() - ref[r, p, ids[r, p + 1]].item()) < 1e-5
    for micro in (1, 2):
        assert torch.allclose(batched_token_logp(model, ids, attn, micro, 0.7) * mask, logp * mask, atol=1e-6)


def test_logits_only_from_the_first_response_column_give_the_same_log_probs(tok):
    """Skipping the LM head on all-prompt columns (logits_to_keep) changes nothing on response tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.rollout.logprobs import response_start

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=64, pad_token_id=0)).eval()
    ids, attn, mask = rb.build_sequences([[5, 6, 7, 8, 9], [8, 3, 4], [9, 10, 11, 12]],
                                         [[11, 12, EOS], [13, EOS], [14, 15, 16, 17]], PAD)
    assert response_start(mask) == 2 and response_start(mask[::2]) == 3 and response_start(mask * 0) == 0
    with torch.no_grad():
        full = token_logp(model, ids, attn)
        trimmed = token_logp(model, ids, attn, start=2)
    assert trimmed.shape == full.shape and trimmed[:, :2].abs().sum() == 0
    torch.testing.assert_close(trimmed * mask, full * mask, atol=1e-6, rtol=0)
    for micro in (1, 2, 3):
        got = batched_token_logp(model, ids, attn, micro, mask=mask)
        torch.testing.assert_close(got * mask, full * mask, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- minibatch shuffling
def _pair_rollout(n_prompts: int, group: int) -> rb.Rollout:
    prompts = [[10 + p] for p in range(n_prompts) for _ in range(group)]
    completions = [[20 + i, EOS] for i in range(n_prompts * group)]
    ids, attn, mask = rb.build_sequences(prompts, completions, PAD)
    n = len(completions)
    ro = rb.Rollout(rows=[{"i": i} for i in range(n)], prompt_texts=[str(i) for i in range(n)],
                    completions=[str(i) for i in range(n)], completion_ids=completions, input_ids=ids,
                    attention_mask=attn, mask=mask, truncated=torch.zeros(n, dtype=torch.bool),
                    prompt_lens=[1] * n, scores=torch.arange(n, dtype=torch.float32),
                    per_source={"correctness": list(range(n))})
    ro.put(adv=torch.arange(n, dtype=torch.float32)[:, None].expand(n, 2).clone(),
           pair_scores=torch.stack([ro.scores[0::2], ro.scores[1::2]], -1), delta=ro.scores[0::2] - ro.scores[1::2])
    return ro


def test_group_shuffle_moves_whole_groups_and_depends_on_the_seed():
    orders = {tuple(rb.group_shuffle_order(12, 3, seed)) for seed in range(6)}
    assert len(orders) > 1
    for order in orders:
        assert sorted(order) == list(range(12))
        for k in range(0, 12, 3):  # each block of 3 is one whole group, in order
            assert order[k] % 3 == 0 and list(order[k:k + 3]) == [order[k], order[k] + 1, order[k] + 2]
    assert rb.group_shuffle_order(12, 3, 5) == rb.group_shuffle_order(12, 3, 5)


def test_take_reorders_every_row_field_and_pairs_follow_their_rows():
    ro = _pair_rollout(4, 2)
    order = rb.group_shuffle_order(len(ro), 2, seed=3)
    assert order != list(range(8))
    out = rb.take(ro, order)
    assert [r["i"] for r in out.rows] == order
    assert out.completion_ids == [ro.completion_ids[i] for i in order]
    assert out.input_ids.tolist() == ro.input_ids[order].tolist()
    assert out.scores.tolist() == [float(i) for i in order]
    assert out.get("adv")[:, 0].tolist() == [float(i) for i in order]
    assert out.per_source["correctness"] == order
    # pair j of the result is rows (2j, 2j+1) of the result
    assert out.get("pair_scores").tolist() == torch.stack([out.scores[0::2], out.scores[1::2]], -1).tolist()
    assert out.get("delta").tolist() == (out.scores[0::2] - out.scores[1::2]).tolist()
    assert ro.scores.tolist() == list(range(8))  # the original is untouched


def test_a_rollout_holds_only_known_extras_and_names_what_is_missing():
    ro = _pair_rollout(1, 2)
    assert ro.get("ref_logp") is None
    with pytest.raises(KeyError, match="unknown rollout extra 'advantages'"):
        ro.put(advantages=ro.scores)
    with pytest.raises(ValueError, match="the value loss reads the rollout's returns"):
        ro.need("returns", "the value loss")
