"""Loading real data: local files or Hugging Face hub datasets, normalised to canonical rows.

A source is one of
  * a local file: `.jsonl` (one object per line), `.json` (a list of objects, or `{"data": [...]}`),
    or `.parquet`;
  * a local directory holding `<split>.jsonl`, `<split>.json` or `<split>.parquet`;
  * a folder written by `datasets`' `save_to_disk`: a DatasetDict (its splits by name) or one Dataset
    (split like a single file);
  * a hub dataset id such as `openai/gsm8k`, read with `datasets.load_dataset(source, name, split=split)`.

Three row shapes are understood, each turned into canonical dicts by one function:
  * question/answer (GSM8K: `answer` ends with `#### n`)          → `to_sft_rows`
  * prompt/chosen/rejected (strings, or TRL conversational lists)  → `to_preference_rows`, `to_sft_rows`
  * chat `messages` (a list of {role, content})                    → `to_sft_rows`
and process-supervision rows (`question`/`prompt`, `steps`, `labels`) → `to_step_rows`.
Column names that differ are renamed first with `map_fields` (config: `data.fields.<canonical>=<column>`).
"""

import json
from pathlib import Path

from rlft.errors import DataError

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


ROW = "_row"  # a local file's rows carry their 1-based row number under this key


def _looks_local(source: str) -> bool:
    """A path that exists, ends in a data suffix, or starts like a path is local, not a hub id."""
    return (
        Path(source).exists()
        or source.endswith(LOCAL_SUFFIXES)
        or source.startswith((".", "/", "~"))
    )


def read_text(path: Path) -> str:
    """The file as UTF-8 text; a DataError naming the line and byte that is not UTF-8 otherwise."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path} line {line}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                        "save it as UTF-8, e.g. iconv -f latin1 -t utf-8 in > out") from None


def _read_jsonl(path: Path) -> list:
    rows = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"{path} line {lineno}: invalid JSON ({err.msg})") from None
    return rows


def _read_json(path: Path) -> list:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of objects or {{\"data\": [...]}}")
    return data


def _read_parquet(path: Path) -> list:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def read_file(path: Path) -> list[dict]:
    """Rows of one local data file; every row must be a JSON object."""
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    if path.suffix not in readers:
        raise DataError(f"{path}: unsupported file type (use .jsonl, .json or .parquet)")
    rows = readers[path.suffix](path)
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DataError(f"{path} row {i}: expected an object, got {type(row).__name__}")
    return [{**row, ROW: i} for i, row in enumerate(rows, start=1)]


def row_number(row: dict, position: int) -> int:
    """The row's number in its file (errors name it even after a held-out split), else its position."""
    return row.get(ROW, position)


def _split_file(directory: Path, split: str) -> Path:
    for suffix in LOCAL_SUFFIXES:
        candidate = directory / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    raise DataError(f"{directory}: no {split}.jsonl, {split}.json or {split}.parquet, and not a folder saved by "
                    "datasets' save_to_disk")


def saved_by_datasets(directory: Path) -> str | None:
    """"dict" for a DatasetDict's `save_to_disk` folder, "dataset" for one Dataset's, None otherwise."""
    if (directory / "dataset_dict.json").is_file():
        return "dict"
    if (directory / "state.json").is_file() and (directory / "dataset_info.json").is_file():
        return "dataset"
    return None


def _load_saved(directory: Path, split: str | None) -> list[dict]:
    """Rows of a `save_to_disk` folder: the named split of a DatasetDict, or all of one Dataset."""
    import datasets

    saved = datasets.load_from_disk(str(directory))
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise DataError(f"{directory}: the saved DatasetDict has no split '{split}' (it has "
                            f"{', '.join(saved)}); set data.train_split / data.test_split")
        saved = saved[split]
    return [{**dict(row), ROW: i} for i, row in enumerate(saved, start=1)]


def _load_hub(source: str, split: str, name: str | None) -> list[dict]:
    import datasets

    try:
        dataset = datasets.load_dataset(source, name, split=split)
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one user-facing line
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"could not load hub dataset '{source}' (split '{split}'): {first_line}") from err
    return [dict(row) for row in dataset]


def load_rows(source: str, split: str = "train", name: str | None = None) -> list[dict]:
    """All rows of `split` from a local file, a local directory, or a hub dataset id."""
    if not _looks_local(source):
        return _load_hub(source, split, name)
    path = Path(source).expanduser()
    saved = saved_by_datasets(path) if path.is_dir() else None
    if saved:
        return _load_saved(path, split if saved == "dict" else None)
    if path.is_dir():
        path = _split_file(path, split)
    return read_file(path)


def map_fields(rows: list[dict], fields: dict[str, str], required: list[str], source: str) -> list[dict]:
    """Rename columns to canonical names (`fields` maps canonical → source column) and check them.

    Mapped source columns are replaced by their canonical names; other columns are kept. A row
    without a required or mapped field (absent or null) raises a DataError naming the source, the
    1-based row, the column and the config key that maps it.
    """
    renamed = set(fields.values()) - set(fields)
    required = list(dict.fromkeys([*required, *fields]))  # a column the user mapped must be there
    out = []
    for i, row in enumerate(rows, start=1):
        new = {key: value for key, value in row.items() if key not in renamed}
        for canonical, column in fields.items():
            if column in row:
                new[canonical] = row[column]
        for canonical in required:
            if new.get(canonical) is None:
                column = fields.get(canonical, canonical)
                what = f"field '{canonical}'" if column == canonical else f"column '{column}' (field '{canonical}')"
                raise DataError(f"{source} row {row_number(row, i)}: missing {what} "
                                f"(map your column with data.fields.{canonical}=<column>)")
        out.append(new)
    return out


def _check_messages(messages: object, where: str) -> list[dict]:
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m and "content" in m for m in messages
    ):
        raise DataError(f"{where}: expected a list of {{role, content}} messages")
    return messages


def split_chat(messages: list[dict], where: str) -> tuple[list[dict], str]:
    """(prompt messages, response text): the response is the last assistant message."""
    _check_messages(messages, where)
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise DataError(f"{where}: the conversation has no assistant message")
    if last == 0:
        raise DataError(f"{where}: the conversation has no prompt before the assistant message")
    return messages[:last], messages[last]["content"]


def _response_text(value: object, where: str) -> str:
    """A completion given as a string or as a conversational list ending in an assistant message."""
    if isinstance(value, str):
        return value
    messages = _check_messages(value, where)
    if not messages or messages[-1]["role"] != "assistant":
        raise DataError(f"{where}: a conversational response must end with an assistant message")
    return messages[-1]["content"]


def _prompt_of(row: dict, where: str) -> str | list[dict]:
    prompt = row.get("prompt", row.get("question"))
    if prompt is None:
        raise DataError(f"{where}: missing field 'prompt' (or 'question')")
    if not isinstance(prompt, str):
        _check_messages(prompt, where)
    return prompt


def to_sft_rows(rows: list[dict], source: str = "data") -> list[dict]:
    """Canonical SFT rows `{prompt, response}`; `prompt` is a string or a list of messages.

    Accepts chat `messages`, `question`/`answer`, `prompt`/`completion` (or `response`), and
    preference rows (trained on `chosen`).
    """
    out = []
    for i, row in enumerate(rows, start=1):
        where = f"{source} row {row_number(row, i)}"
        if "messages" in row:
            prompt, response = split_chat(row["messages"], where)
        else:
            key = next((k for k in ("answer", "completion", "response", "chosen") if row.get(k) is not None), None)
            if key is None:
                raise DataError(f"{where}: no response field (expected messages, answer, completion or chosen, "
                                "not null; map your column with data.fields.answer=<column>)")
            prompt, response = _prompt_of(row, where), _response_text(row[key], where)
        out.append({"prompt": prompt, "response": response})
    return out


def to_preference_rows(rows: list[dict], source: str = "data") -> list[dict]:
    """Canonical preference rows `{prompt, chosen, rejected}` (chosen/rejected as text).

    Conversational rows without a prompt (TRL's implicit-prompt format, where `chosen` holds the
    whole conversation) take the prompt from the messages before `chosen`'s last assistant turn.
    """
    out, identical = [], 0
    for i, row in enumerate(rows, start=1):
        where = f"{source} row {row_number(row, i)}"
        for key in ("chosen", "rejected"):
            if row.get(key) is None:
                raise DataError(f"{where}: missing field '{key}' (map your column with data.fields.{key}=<column>)")
        if "prompt" not in row and "question" not in row and isinstance(row["chosen"], list):
            prompt, chosen = split_chat(row["chosen"], where)
        else:
            prompt, chosen = _prompt_of(row, where), _response_text(row["chosen"], where)
        rejected = _response_text(row["rejected"], where)
        if chosen == rejected:  # no preference to learn: dropped, and counted below
            identical += 1
            continue
        out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    if identical:
        print(f"[rlft] {source}: dropped {identical} preference row(s) whose chosen and rejected are identical",
              flush=True)
    return out


def to_step_rows(rows: list[dict], source: str = "data") -> list[dict]:
    """Canonical process-supervision rows `{prompt, steps, labels}` with 0/1 integer labels."""
    out = []
    for i, row in enumerate(rows, start=1):
        where = f"{source} row {row_number(row, i)}"
        steps, labels = row.get("steps"), row.get("labels")
        if not isinstance(steps, list) or not isinstance(labels, list):
            raise DataError(f"{where}: 'steps' and 'labels' must both be lists")
        if len(steps) != len(labels) or not steps:
            raise DataError(f"{where}: {len(steps)} steps but {len(labels)} labels (need one label per step)")
        if any(label not in (0, 1) for label in labels):
            raise DataError(f"{where}: labels must be 0/1 (or true/false)")
        out.append({"prompt": _prompt_of(row, where), "steps": list(steps), "labels": [int(x) for x in labels]})
    return out
