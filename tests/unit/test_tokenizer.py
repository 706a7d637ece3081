"""The built-in character tokenizer: exact round trips, special ids, save/load through AutoTokenizer."""

import string

import pytest
from transformers import AutoTokenizer

from rlft.data.tokenizer import build_char_tokenizer

TEXT = "  Ann has 23 pens.\nShe buys 15 more.  \n\n#### 38 " + string.punctuation + string.ascii_letters


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_round_trip_is_exact(tok):
    ids = tok(TEXT)["input_ids"]
    assert tok.decode(ids) == TEXT
    # one id per character, nothing added (no BOS, no EOS)
    assert len(ids) == len(TEXT)


def test_every_printable_character_is_its_own_token(tok):
    printable = "\n" + "".join(chr(c) for c in range(32, 127))
    ids = tok(printable, add_special_tokens=True)["input_ids"]
    assert len(set(ids)) == len(printable) == len(ids)
    assert tok.unk_token_id not in ids
    assert len(tok) == 4 + len(printable)


def test_special_tokens(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.decode([2, 5], skip_special_tokens=True) == " "
    assert tok.chat_template is None
    assert tok.model_max_length == 512


def test_unknown_characters_become_unk(tok):
    ids = tok("a\u00e9b\tc")["input_ids"]
    assert ids[1] == tok.unk_token_id and ids[3] == tok.unk_token_id
    assert len(ids) == 5


def test_offsets_are_one_character_each(tok):
    enc = tok("ab\ncd", return_offsets_mapping=True)
    assert enc["offset_mapping"] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_save_and_load_with_auto_tokenizer(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok(TEXT)["input_ids"]
    assert loaded(TEXT)["input_ids"] == ids
    assert loaded.decode(ids) == TEXT
    assert loaded.eos_token_id == 2 and loaded.pad_token_id == 0
    assert loaded.model_max_length == 512
