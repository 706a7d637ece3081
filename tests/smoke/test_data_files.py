"""Each supervised stage on the user's own local jsonl files (data=jsonl), tiny built-in model, 2 steps.

A single file is split: a seeded 10% of its rows (at least one) is held out as the test split, the
rest trains. The stage prints how many examples it built, which pins down that every row
was read and mapped; a mapping that failed would stop the run with a DataError.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from helpers import TINY_MODEL, assert_finite, check_ok, read_manifest, run_cli, stage_dir, tmp_leftovers, train_records

STEPS = 2
ARGS = ["data=jsonl", "model.path=builtin:tiny", *TINY_MODEL, f"train.max_steps={STEPS}", "train.batch_size=8",
        "train.micro_batch_per_device=4", "train.log_every=1"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def gsm8k_rows(n: int, start: int = 0) -> list[dict]:
    return [{"question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?",
             "answer": f"He has {i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3} apples.\n#### {2 * i + 3}"}
            for i in range(start, start + n)]


def train_ok(tmp_path: Path, algo: str, name: str, source: Path, *extra: str):
    proc = check_ok(run_cli(tmp_path, "train", f"algo={algo}", f"run.name={name}", f"data.source={source}",
                            *ARGS, *extra))
    run = stage_dir(tmp_path, name, algo)
    records = train_records(run)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert_finite(r["loss"] for r in records)
    assert read_manifest(run)["completed"] is True
    assert (run / "final" / "model.safetensors").is_file()
    assert not tmp_leftovers(run)
    return proc, run, records


def test_sft_on_gsm8k_style_jsonl(tmp_path):
    data = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(12))
    proc, run, records = train_ok(tmp_path, "sft", "gsm", data)
    assert "sft: 11 training examples" in proc.stdout
    assert abs(records[0]["loss"] - math.log(100)) < 0.15
    assert 0.0 <= records[-1]["token_acc"] <= 1.0


def test_sft_on_chat_messages(tmp_path):
    rows = [{"messages": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]}
            for r in gsm8k_rows(10)]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    proc, _, _ = train_ok(tmp_path, "sft", "chat", data)
    assert "sft: 9 training examples" in proc.stdout


def test_sft_with_custom_column_names(tmp_path):
    rows = [{"problem": r["question"], "solution": r["answer"], "id": i} for i, r in enumerate(gsm8k_rows(9))]
    data = write_jsonl(tmp_path / "custom.jsonl", rows)
    proc, run, _ = train_ok(tmp_path, "sft", "custom", data, "data.fields.question=problem",
                            "data.fields.answer=solution")
    assert "sft: 8 training examples" in proc.stdout
    config = (run / "config.yaml").read_text()
    assert "question: problem" in config and "answer: solution" in config


def test_rm_on_preference_jsonl(tmp_path):
    rows = [{"prompt": r["question"], "chosen": r["answer"], "rejected": r["answer"].replace("####", "#### 1")}
            for r in gsm8k_rows(12)]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    proc, _, records = train_ok(tmp_path, "rm", "pairs", data)
    assert "rm: 11 training and 1 held-out examples" in proc.stdout
    assert abs(records[0]["loss"] - math.log(2)) < 0.2
    assert all(0.0 <= r["pair_acc"] <= 1.0 for r in records)


def test_prm_on_step_label_jsonl(tmp_path):
    rows = []
    for i in range(12):
        good = i % 2 == 0
        rows.append({"prompt": f"What is {i} + {i + 1} + 1?",
                     "steps": [f"{i} + {i + 1} = {2 * i + 1}", f"{2 * i + 1} + 1 = {2 * i + 2 if good else 2 * i + 5}"],
                     "labels": [1, 1 if good else 0]})
    data = write_jsonl(tmp_path / "steps.jsonl", rows)
    proc, _, records = train_ok(tmp_path, "prm", "steps", data)
    assert "prm: 11 training and 1 held-out examples" in proc.stdout
    assert abs(records[0]["loss"] - math.log(2)) < 0.2
    assert all(0.0 <= r["step_acc"] <= 1.0 for r in records)
