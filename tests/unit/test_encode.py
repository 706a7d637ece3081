"""Prompt rendering and tokenisation into SFT, preference and process-reward examples."""

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

from rlft.data.encode import collate_padded, encode_pair, encode_prompt, encode_sft, encode_steps, pad_to
from rlft.data.formatting import DEFAULT_TEMPLATE, render_prompt
from rlft.data.loading import DataError, load_rows, map_fields, to_sft_rows
from rlft.data.tokenizer import build_char_tokenizer, char_vocab

GSM8K = Path(__file__).resolve().parents[1] / "data" / "gsm8k_sample.jsonl"
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def subword_tokenizer(add_bos: bool = False) -> PreTrainedTokenizerFast:
    """Characters plus one merged token "2\\n" that straddles a step end and its separator."""
    vocab = char_vocab()
    vocab["2\n"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("2", "\n")], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def test_render_plain_template(tok):
    assert render_prompt(tok, "2+2?") == "Q: 2+2?\nA:\n"
    assert render_prompt(tok, "2+2?", template="{question} =") == "2+2? ="
    assert render_prompt(tok, [{"role": "user", "content": "2+2?"}]) == DEFAULT_TEMPLATE.format(question="2+2?")
    with pytest.raises(DataError, match="needs a tokenizer with a chat template"):
        render_prompt(tok, [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with pytest.raises(DataError, match="no chat template"):
        render_prompt(tok, "2+2?", use_chat_template=True)


def test_render_chat_template():
    chat_tok = build_char_tokenizer()
    chat_tok.chat_template = CHAT_TEMPLATE
    assert render_prompt(chat_tok, "2+2?") == "<user>2+2?\n<assistant>"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert render_prompt(chat_tok, messages) == "<system>s\n<user>u\n<assistant>"
    assert render_prompt(chat_tok, messages, use_chat_template=False) == "<system>s\n<user>u\n<assistant>"
    assert render_prompt(chat_tok, "2+2?", use_chat_template=False) == "Q: 2+2?\nA:\n"


def test_gsm8k_file_to_sft_examples(tok):
    rows = map_fields(load_rows(str(GSM8K)), {}, ["question", "answer"], str(GSM8K))
    sft = to_sft_rows(rows, source=str(GSM8K))
    examples = [encode_sft(tok, render_prompt(tok, r["prompt"]), r["response"], max_len=512) for r in sft]
    for example, row in zip(examples, rows):
        ids, mask = example["input_ids"], example["loss_mask"]
        assert not example["truncated"] and len(ids) == len(mask)
        trained = [i for i, m in zip(ids, mask) if m]
        assert trained[-1] == tok.eos_token_id
        assert tok.decode(trained[:-1]) == row["answer"]
        assert tok.decode(ids[: mask.index(1)]) == f"Q: {row['question']}\nA:\n"


def test_encode_sft_mask_and_truncation(tok):
    example = encode_sft(tok, "ab", "cd", max_len=10)
    assert example == {"input_ids": [70, 71, 72, 73, 2], "loss_mask": [0, 0, 1, 1, 1], "truncated": False}
    cut = encode_sft(tok, "ab", "cd", max_len=4)
    assert cut == {"input_ids": [70, 71, 72, 73], "loss_mask": [0, 0, 1, 1], "truncated": True}


def test_bos_only_when_the_tokenizer_adds_it(tok):
    assert encode_prompt(tok, "ab") == [70, 71]
    bos_tok = subword_tokenizer(add_bos=True)
    assert encode_prompt(bos_tok, "ab") == [1, 70, 71]
    assert encode_sft(bos_tok, "ab", "c", max_len=8)["loss_mask"] == [0, 0, 0, 1, 1]


def test_encode_pair(tok):
    pair = encode_pair(tok, "ab", "c", "de", max_len=5)
    assert pair["chosen_ids"] == [70, 71, 72, 2] and pair["chosen_mask"] == [0, 0, 1, 1]
    assert pair["rejected_ids"] == [70, 71, 73, 74, 2] and pair["rejected_mask"] == [0, 0, 1, 1, 1]
    assert pair["truncated"] is False
    assert encode_pair(tok, "ab", "c", "def", max_len=5)["truncated"] is True


def test_encode_steps_char_tokenizer(tok):
    prompt = "Q: x\nA:\n"
    steps, labels = ["1+1=2", "2*3=6", "#### 6"], [1, 0, 0]
    out = encode_steps(tok, prompt, steps, labels, max_len=64)
    ids = out["input_ids"]
    assert tok.decode(ids) == prompt + "\n".join(steps) + "<eos>"
    assert out["step_positions"] == [12, 18, 25]
    assert [tok.decode([ids[p]]) for p in out["step_positions"]] == ["2", "6", "6"]
    assert out["step_labels"] == labels and not out["truncated"]
    cut = encode_steps(tok, prompt, steps, labels, max_len=20)
    assert cut["step_positions"] == [12, 18] and cut["step_labels"] == [1, 0] and cut["truncated"]


def test_encode_steps_subword_token_straddling_the_separator():
    sub = subword_tokenizer()
    out = encode_steps(sub, "Q: x\nA:\n", ["1+1=2", "2+2=4"], [1, 1], max_len=64)
    ids = out["input_ids"]
    # tokens after the 8 prompt tokens: 1 + 1 = "2\n" 2 + 2 = 4 <eos>
    assert len(ids) == 8 + 10 + 1
    assert out["step_positions"] == [12, 17]
    assert sub.convert_ids_to_tokens(ids[12]) == "2\n" and sub.convert_ids_to_tokens(ids[17]) == "4"


def test_encode_steps_rejects_bad_input(tok):
    with pytest.raises(ValueError, match="2 steps but 1 labels"):
        encode_steps(tok, "q", ["a", "b"], [1], max_len=10)
    with pytest.raises(ValueError, match="non-empty"):
        encode_steps(tok, "q", ["a", ""], [1, 1], max_len=10)


def test_collate_right_and_left():
    ids, att = collate_padded([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and att.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids.dtype == torch.long and att.dtype == torch.long
    ids, att = collate_padded([[5, 6, 7], [8]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and att.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_pad_to():
    assert pad_to([[1], [1, 1]], 0, side="left").tolist() == [[0, 1], [1, 1]]
    assert pad_to([[0.5], []], -1.0, dtype=torch.float).tolist() == [[0.5], [-1.0]]
    with pytest.raises(ValueError, match="side"):
        pad_to([[1]], 0, side="middle")


def test_data_text_that_spells_a_special_token_stays_text(capsys):
    """data.special_tokens_in_text=literal (default): `<eos>` in a question or a response is the five characters,
    while the chat template's own <bos>/<eos> stay tokens; parse lets the data's string act as the token."""
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.stages import inputs

    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}<bos>{{ m['content'] }}<eos>{% endfor %}<bos>"
    cfg = OmegaConf.structured(Config)
    row = {"prompt": "say <eos> now"}
    eos, bos = tok.eos_token_id, tok.bos_token_id
    literal = encode_sft(tok, inputs.render(cfg, tok, row), "a<eos>b", max_len=256)
    cfg.data.special_tokens_in_text = "parse"
    parsed = encode_sft(tok, inputs.render(cfg, tok, row), "a<eos>b", max_len=256)
    prompt_literal = literal["input_ids"][:literal["loss_mask"].index(1)]
    prompt_parsed = parsed["input_ids"][:parsed["loss_mask"].index(1)]
    assert prompt_literal.count(eos) == 1 and prompt_literal.count(bos) == 2  # the template's own tokens
    assert prompt_parsed.count(eos) == 2
    assert tok.decode(prompt_literal) == tok.decode(prompt_parsed)  # the same text either way
    assert literal["input_ids"].count(eos) == 2 and parsed["input_ids"].count(eos) == 4  # + the response's, and EOS
    assert "'<eos>'" in capsys.readouterr().out  # said once
    plain = encode_sft(tok, inputs.render(cfg, tok, {"prompt": "2+2"}), "4", max_len=256)
    cfg.data.special_tokens_in_text = "literal"
    assert encode_sft(tok, inputs.render(cfg, tok, {"prompt": "2+2"}), "4", max_len=256) == plain  # no change
