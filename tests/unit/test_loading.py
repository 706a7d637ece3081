"""Loading local data files and normalising the three row shapes."""

import json
from pathlib import Path

import pytest

from rlft.data.loading import (
    DataError,
    load_rows,
    map_fields,
    to_preference_rows,
    to_sft_rows,
    to_step_rows,
)

GSM8K = Path(__file__).resolve().parents[1] / "data" / "gsm8k_sample.jsonl"
ROWS = [{"question": "1+1?", "answer": "1+1=2\n#### 2"}, {"question": "2+2?", "answer": "2+2=4\n#### 4"}]


def numbered(rows: list[dict]) -> list[dict]:
    """Rows as read from a local file: each carries its 1-based row number."""
    return [{**r, "_row": i} for i, r in enumerate(rows, start=1)]


def test_load_gsm8k_jsonl_fixture():
    rows = load_rows(str(GSM8K))
    assert len(rows) == 4
    assert all(set(r) == {"question", "answer", "_row"} for r in rows)  # _row: the row's number in its file
    assert [r["_row"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["answer"].endswith("#### 60")


def test_load_json_list_and_data_key(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    (tmp_path / "b.json").write_text(json.dumps({"data": ROWS}))
    assert load_rows(str(tmp_path / "a.json")) == numbered(ROWS)
    assert load_rows(str(tmp_path / "b.json")) == numbered(ROWS)


def test_load_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "rows.parquet")
    assert load_rows(str(tmp_path / "rows.parquet")) == numbered(ROWS)


def test_load_split_from_directory(tmp_path):
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS[:1]) + "\n\n")
    (tmp_path / "train.json").write_text(json.dumps(ROWS))
    assert load_rows(str(tmp_path), split="test") == numbered(ROWS[:1])
    assert load_rows(str(tmp_path)) == numbered(ROWS)
    with pytest.raises(DataError, match="no validation.jsonl"):
        load_rows(str(tmp_path), split="validation")


def test_load_a_folder_saved_by_datasets(tmp_path):
    """`save_to_disk` folders: a DatasetDict gives its splits by name (a missing one names those it has); one
    Dataset is all rows, split by the stage like a single file."""
    import datasets

    from rlft.data.loading import saved_by_datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(str(tmp_path / "dict"))
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    assert load_rows(str(tmp_path / "dict")) == numbered(ROWS)
    assert load_rows(str(tmp_path / "dict"), split="test") == numbered(ROWS[:1])
    with pytest.raises(DataError, match=r"no split 'validation' \(it has train, test\)"):
        load_rows(str(tmp_path / "dict"), split="validation")
    assert load_rows(str(tmp_path / "one")) == numbered(ROWS)
    assert [saved_by_datasets(tmp_path / d) for d in ("dict", "one")] == ["dict", "dataset"]
    assert saved_by_datasets(tmp_path) is None


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "train.jsonl"
    with pytest.raises(DataError) as err:
        load_rows(str(missing))
    assert str(err.value) == f"data file not found: {missing}"


def test_bad_json_line_and_non_object_rows(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a"}\n{oops\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 2: invalid JSON"):
        load_rows(str(path))
    path.write_text('{"question": "a"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"bad.jsonl row 2: expected an object, got list"):
        load_rows(str(path))


def test_a_file_that_is_not_utf8_names_the_line_and_the_fix(tmp_path):
    for suffix in (".jsonl", ".json"):
        path = tmp_path / f"latin1{suffix}"
        path.write_bytes('[{"question": "a"},\n{"question": "caf\u00e9"}]'.encode("latin-1") if suffix == ".json"
                         else '{"question": "a"}\n{"question": "caf\u00e9"}\n'.encode("latin-1"))
        with pytest.raises(DataError) as err:
            load_rows(str(path))
        assert str(err.value).startswith(f"{path} line 2: not UTF-8 text (byte 0xe9") and "iconv" in str(err.value)


def test_hub_ids_go_to_datasets(monkeypatch):
    import datasets

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: calls.append((a, kw)) or ROWS)
    assert load_rows("openai/gsm8k", split="test", name="main") == ROWS
    assert calls == [(("openai/gsm8k", "main"), {"split": "test"})]


def test_map_fields_renames_custom_columns():
    rows = [{"problem": "1+1?", "solution": "#### 2", "id": 7}]
    out = map_fields(rows, {"question": "problem", "answer": "solution"}, ["question", "answer"], "x.jsonl")
    assert out == [{"question": "1+1?", "answer": "#### 2", "id": 7}]


def test_missing_field_message():
    rows = ROWS + [dict(ROWS[0]), {"question": "3+3?"}]
    with pytest.raises(DataError) as err:
        map_fields(rows, {}, ["question", "answer"], "data/train.jsonl")
    assert str(err.value) == (
        "data/train.jsonl row 4: missing field 'answer' (map your column with data.fields.answer=<column>)"
    )


def test_missing_mapped_column_message(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"q": "a", "sol": "#### 1"}\n{"q": "b"}\n')
    with pytest.raises(DataError) as err:
        map_fields(load_rows(str(path)), {"question": "q", "answer": "sol"}, ["question", "answer"], str(path))
    assert str(err.value) == (
        f"{path} row 2: missing column 'sol' (field 'answer') (map your column with data.fields.answer=<column>)"
    )


def test_sft_rows_from_question_answer_and_completion():
    assert to_sft_rows(ROWS[:1]) == [{"prompt": "1+1?", "response": "1+1=2\n#### 2"}]
    conversational = {
        "prompt": [{"role": "user", "content": "hi"}],
        "completion": [{"role": "assistant", "content": "hello"}],
    }
    assert to_sft_rows([conversational]) == [{"prompt": conversational["prompt"], "response": "hello"}]


def test_sft_rows_from_chat_messages():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    (row,) = to_sft_rows([{"messages": messages}])
    assert row == {"prompt": messages[:4], "response": "6"}
    with pytest.raises(DataError, match="chats.jsonl row 1: the conversation has no assistant message"):
        to_sft_rows([{"messages": messages[:2]}], source="chats.jsonl")
    with pytest.raises(DataError, match="row 1: no response field"):
        to_sft_rows([{"question": "q"}])


def test_preference_rows_plain_and_conversational():
    plain = {"prompt": "p", "chosen": "good", "rejected": "bad"}
    assert to_preference_rows([plain]) == [plain]
    user = [{"role": "user", "content": "p"}]
    explicit = {
        "prompt": user,
        "chosen": [{"role": "assistant", "content": "good"}],
        "rejected": [{"role": "assistant", "content": "bad"}],
    }
    implicit = {
        "chosen": user + [{"role": "assistant", "content": "good"}],
        "rejected": user + [{"role": "assistant", "content": "bad"}],
    }
    expected = {"prompt": user, "chosen": "good", "rejected": "bad"}
    assert to_preference_rows([explicit, implicit]) == [expected, expected]
    with pytest.raises(DataError, match="prefs row 2: missing field 'rejected'"):
        to_preference_rows([plain, {"prompt": "p", "chosen": "c"}], source="prefs")


def test_step_rows():
    rows = [{"question": "q", "steps": ["1+1=2", "#### 2"], "labels": [True, False]}]
    assert to_step_rows(rows) == [{"prompt": "q", "steps": ["1+1=2", "#### 2"], "labels": [1, 0]}]
    with pytest.raises(DataError, match="row 1: 2 steps but 1 labels"):
        to_step_rows([{"prompt": "q", "steps": ["a", "b"], "labels": [1]}])
    with pytest.raises(DataError, match="labels must be 0/1"):
        to_step_rows([{"prompt": "q", "steps": ["a"], "labels": [0.5]}])
