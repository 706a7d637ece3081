"""Where stages write, and how one stage finds another's output.

Layout of a run (the contract in README.md, "Outputs and hand-off"):

    runs/<run.name>/<algo>/
        config.yaml      resolved config of the stage
        metrics.jsonl    one JSON object per logged step
        manifest.json    stage, parent checkpoint, summary metrics; written last = stage complete
        checkpoints/     resumable DeepSpeed checkpoints (step-NNNNNNN/)
        final/           Hugging Face model directory
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rlft import gguf
from rlft.trainer.integrity import damage
from rlft.errors import MissingInputError

STAGE_PREFIX = "stage:"
BUILTIN_MODEL = "builtin:tiny"


def stage_dir(cfg) -> Path:
    """Output directory of the configured stage."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    return Path(cfg.run.root) / cfg.run.name / cfg.algo.name


def run_stage_dir(cfg, stage: str) -> Path:
    return Path(cfg.run.root) / cfg.run.name / stage


def write_json_atomic(path: Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def write_jsonl_atomic(path: Path, records: list) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
    os.replace(tmp, path)


def read_manifest(directory: Path) -> dict | None:
    path = Path(directory) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def write_manifest(directory: Path, *, stage: str, parent: str, summary: dict, run_name: str,
                   data: dict | None = None) -> None:
    write_json_atomic(Path(directory) / "manifest.json", {
        "stage": stage, "run_name": run_name, "parent": parent, "final": "final", "data": data or {},
        "summary": summary, "completed": True, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })


def resolve_model_path(cfg, path: str | None = None) -> str:
    """Turn model.path into something loadable: builtin:tiny, a directory or a hub id (a GGUF file or
`package:<module>` becomes its converted folder, rlft/gguf.py).

    `auto` means the algorithm's default input; `stage:<algo>` means this run's output of
    that stage, which must be complete."""
    path = path if path is not None else cfg.model.path
    if path == "auto":
        path = cfg.algo.init_from
    if path.startswith(STAGE_PREFIX):
        stage = path[len(STAGE_PREFIX):]
        directory = run_stage_dir(cfg, stage)
        final = directory / "final"
        command = f"rlft train algo={stage} run.name={cfg.run.name}" + \
            (f" run.root={cfg.run.root}" if cfg.run.root != "runs" else "")
        if not (final.is_dir() and read_manifest(directory)):
            raise MissingInputError(f"no completed '{stage}' checkpoint at {final}; make it first with: {command}")
        problem = damage(final)
        if problem:
            raise MissingInputError(f"the '{stage}' model at {final} is damaged: {problem}; "
                                    f"train it again with: {command} overwrite=true")
        return str(final)
    if path == BUILTIN_MODEL or path.startswith("builtin:"):
        if path != BUILTIN_MODEL:
            raise MissingInputError(f"unknown built-in model '{path}'; the built-in model is {BUILTIN_MODEL}")
        return path
    if gguf.is_gguf(path):  # a GGUF file, or the one a package ships: its plain folder (converted once)
        return gguf.plain_folder(path)
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise MissingInputError(f"{local} is not a Hugging Face model directory (no config.json)")
        try:
            json.loads((local / "config.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise MissingInputError(f"{local / 'config.json'} is not valid JSON ({exc}); the model directory is "
                                    "damaged: copy or export it again") from None
        problem = damage(local)  # rlft's own exports carry checksums.json
        if problem:
            raise MissingInputError(f"the model at {local} is damaged: {problem}; copy or export it again")
        return str(local)
    if path.startswith((".", "/", "~")) or path.count("/") > 1:
        raise MissingInputError(f"model path {path} does not exist")
    return path  # a hub id
