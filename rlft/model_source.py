"""Where a model comes from: `model.path` (and every other model a run names: the reward models, the critic's start,
the teacher, a sampling model) turned into something loadable, checked before anything loads.

    builtin:tiny                 the built-in model (built from the config)
    stage:<algo>                 this run's output of that stage (complete, intact: rlft/files/handoff.py)
    <file>.gguf, package:<mod>   a GGUF checkpoint, converted once to a plain folder (rlft/gguf.py)
    <adapter folder>             a LoRA adapter merged onto its base once (rlft/lora.py)
    <folder>                     a Hugging Face model folder (config.json readable, checksums if it has them)
    <org>/<name>                 a hub id, left to transformers
"""
from __future__ import annotations

import json
from pathlib import Path

from rlft import gguf, lora
from rlft.errors import MissingInputError
from rlft.files import handoff
from rlft.files.integrity import damage


def resolve_model_path(cfg, path: str | None = None) -> str:
    """Turn model.path into something loadable: builtin:tiny, a directory or a hub id (a GGUF file or
`package:<module>` becomes its converted folder, rlft/gguf.py; a LoRA adapter folder its merged model,
rlft/lora.py).

    `auto` means the algorithm's default input; `stage:<algo>` means this run's output of
    that stage, which must be complete."""
    path = path if path is not None else cfg.model.path
    if path == "auto":
        path = cfg.algo.init_from
    if path.startswith(handoff.STAGE_PREFIX):
        stage = path[len(handoff.STAGE_PREFIX):]
        directory = handoff.run_stage_dir(cfg, stage)
        final = directory / "final"
        command = f"rlft train algo={stage} run.name={cfg.run.name}" + \
            (f" run.root={cfg.run.root}" if cfg.run.root != "runs" else "")
        if not (final.is_dir() and handoff.read_manifest(directory)):
            raise MissingInputError(f"no completed '{stage}' checkpoint at {final}; make it first with: {command}")
        problem = damage(final)
        if problem:
            raise MissingInputError(f"the '{stage}' model at {final} is damaged: {problem}; "
                                    f"train it again with: {command} overwrite=true")
        return str(final)
    if path == handoff.BUILTIN_MODEL or path.startswith("builtin:"):
        if path != handoff.BUILTIN_MODEL:
            raise MissingInputError(f"unknown built-in model '{path}'; the built-in model is {handoff.BUILTIN_MODEL}")
        return path
    if gguf.is_gguf(path):  # a GGUF file, or the one a package ships: its plain folder (converted once)
        return gguf.plain_folder(path)
    local = Path(path).expanduser()
    if (local / "adapter_config.json").is_file() and not (local / "config.json").is_file():
        return lora.merged_folder(local, lambda base: resolve_model_path(cfg, base), cfg.model.trust_remote_code)
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
