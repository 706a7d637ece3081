"""Where stages write, and how one stage finds another's output: stage folders, `stage:<algo>` paths,
manifests, and files and Hugging Face folders written atomically (the layout: rlft/files/__init__.py;
the contract: README.md, "Outputs and hand-off")."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from rlft.errors import DiskFullError
from rlft.files.integrity import raise_if_disk_full, space_shortage, write_checksums, write_text_atomic

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
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_jsonl_atomic(path: Path, records: list) -> None:
    write_text_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def read_manifest(directory: Path) -> dict | None:
    path = Path(directory) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def stage_config(stage_dir: Path):
    """The resolved config a stage wrote beside its outputs (its config.yaml), or None where there is none."""
    from omegaconf import OmegaConf

    path = Path(stage_dir) / "config.yaml"
    return OmegaConf.load(path) if path.is_file() else None


def write_manifest(directory: Path, *, stage: str, parent: str, summary: dict, run_name: str,
                   data: dict | None = None) -> None:
    write_json_atomic(Path(directory) / "manifest.json", {
        "stage": stage, "run_name": run_name, "parent": parent, "final": "final", "data": data or {},
        "summary": summary, "completed": True, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })


def replace_dir(src: Path, dst: Path) -> None:
    """Move src to dst; an existing dst is swapped out first so dst is never half-written."""
    old = dst.parent / f".old-{dst.name}-{os.getpid()}"
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def save_hf_dir(model, state_dict, tokenizer, out_dir: Path) -> None:
    """save_pretrained into a temporary sibling, then rename over out_dir."""
    weights = state_dict if state_dict is not None else model.state_dict()
    from rlft import lora

    def write(tmp: Path) -> None:
        with lora.unquantized_view(model):  # QLoRA: the state dict is dequantized; save it as a plain model
            model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_checksums(tmp)

    write_dir(Path(out_dir), write, sum(v.numel() * v.element_size() for v in weights.values()))


def save_adapter_dir(peft_model, out_dir: Path) -> None:
    """A LoRA adapter folder written by peft (PeftModel.save_pretrained) into a temporary sibling, then renamed
    over out_dir."""
    write_dir(Path(out_dir), lambda tmp: peft_model.save_pretrained(str(tmp), safe_serialization=True))


def write_dir(out_dir: Path, write, size_bytes: int = 0) -> None:
    """`write(tmp)` fills a temporary sibling of out_dir, which then replaces out_dir: a folder that exists is
    complete. A disk too small for `size_bytes`, or one that fills during the write, is a DiskFullError."""
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    short = space_shortage(tmp.parent, size_bytes, str(out_dir))
    if short:
        raise DiskFullError(short)
    try:
        write(tmp)
    except (OSError, RuntimeError) as exc:
        raise_if_disk_full(exc, tmp, str(out_dir))
        raise
    replace_dir(tmp, out_dir)
