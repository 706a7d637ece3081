"""scripts/scale_check.py end to end at the real vocabulary size on a small width (the 0.5B shape itself takes
about half an hour on 2 cores: docs/performance.md): the model directory with its locally built tokenizer
loads like a checkpoint, SFT and GRPO run with LoRA through `rlft train`, and the table compares each
run's measured peak with rlft.memory's prediction."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_tokenizer_has_the_vocabulary_and_a_chat_template(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    import scale_model

    tok = scale_model.build_tokenizer(151936)
    assert len(tok) == 151936
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?\nA:"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text).input_ids
    assert tok.decode(ids) == text  # byte-level: spaces and newlines survive
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.eos_token == "<|im_end|>"


def test_scale_check_lora_at_the_real_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "scale_check.py"), "--shape", "qwen2.5-vocab-small",
                           "--setups", "lora", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "scale_check.json").read_text())
    assert [(r["setup"], r["stage"]) for r in rows] == [("lora", "sft"), ("lora", "grpo")]
    model = tmp_path / "qwen2.5-vocab-small-shape"
    assert json.loads((model / "config.json").read_text())["vocab_size"] == 151936
    for r in rows:
        measured, predicted = r["measured_gib"][0], r["predicted_gib"][0]
        assert measured > r["runtime_gib"] > 0.1
        # the logits of 151,936 tokens dominate at this width: a missing or doubled term shows
        assert 0.6 < measured / predicted < 1.6, r
        assert r["predicted_parts_gib"]["reference"] == 0  # LoRA: the base model is the reference
    grpo = rows[1]["predicted_parts_gib"]
    assert grpo["generation"] > 0 and grpo["training"] > grpo["Adam"]
    assert "| lora | grpo | 1 |" in (tmp_path / "scale_check.md").read_text()
