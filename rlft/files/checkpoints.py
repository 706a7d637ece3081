"""Resumable checkpoints on disk: `<stage>/checkpoints/step-NNNNNNN/`, written through a temporary folder that
is renamed into place once it holds every engine's state, the config it was trained with
(`config.json`) and its checksums; the newest intact one is found again on resume, and a resume whose
config changes what is trained is refused with the keys that differ. The trainer (rlft/trainer) writes
and reads the DeepSpeed state inside; everything around it is here."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rlft import dist
from rlft.config.schema import RENAMED_SECTIONS, resume_free_keys
from rlft.errors import DiskFullError, StageError
from rlft.files.integrity import damage, space_shortage, write_checksums

CHECKPOINT_CONFIG = "config.json"


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Completed resumable checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def last_checkpoint_bytes(ckpt_root: Path) -> int:
    """Size of the newest checkpoint (0 when there is none): what the next one will need."""
    ckpts = list_checkpoints(ckpt_root)
    return sum(p.stat().st_size for p in ckpts[-1].rglob("*") if p.is_file()) if ckpts else 0


def step_dir(ckpt_root: Path, step: int) -> Path:
    """Where checkpoint step-N lives once complete."""
    return Path(ckpt_root) / f"step-{step:07d}"


def start_checkpoint(ckpt_root: Path, step: int, state_bytes: int) -> Path:
    """Collective: the empty temporary folder for checkpoint step-N (made by the main rank), once every rank
    knows the disk has room for it (the size of the last checkpoint, else `state_bytes`)."""
    tmp = ckpt_root / f".tmp-{step_dir(ckpt_root, step).name}"
    short = space_shortage(ckpt_root, last_checkpoint_bytes(ckpt_root) or state_bytes, f"checkpoint step-{step:07d}")
    if dist.all_reduce_max([float(short is not None)])[0]:  # every rank stops together
        raise DiskFullError(short or "not enough disk space for a checkpoint on another rank")
    if dist.info().is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    return tmp


def commit_checkpoint(tmp: Path, step: int, cfg, keep: int) -> Path:
    """Main rank: record the config the state was trained with (read before a resume loads anything) and the
    checksums, rename the folder into place, and remove the oldest checkpoints beyond `keep`."""
    from omegaconf import OmegaConf

    final = step_dir(tmp.parent, step)
    (tmp / CHECKPOINT_CONFIG).write_text(json.dumps(OmegaConf.to_container(cfg, resolve=True), default=str))
    write_checksums(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in list_checkpoints(tmp.parent)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def intact_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest checkpoint that matches its checksums, saying which newer ones were skipped and why
    (the main rank checks; every rank gets its answer). None when there is no checkpoint; StageError
    when there are checkpoints but none is intact."""
    problems: list[str] = []
    choice = None
    if dist.info().is_main:
        for path in reversed(list_checkpoints(ckpt_root)):
            problem = damage(path)
            if problem is None:
                choice = str(path)
                break
            problems.append(f"{path.name}: {problem}")
    choice, problems = dist.all_gather_object((choice, problems))[0]
    for line in problems:
        dist.print0(f"[rlft] skipping damaged checkpoint {ckpt_root}/{line}")
    if choice is None and problems:
        raise StageError(f"no intact checkpoint under {ckpt_root} ({'; '.join(problems)}); "
                         "rerun without resume=true to start the stage over")
    if choice is not None and problems:
        dist.print0(f"[rlft] resuming from the newest intact checkpoint, {choice}")
    return Path(choice) if choice else None


def saved_config(path: Path) -> dict | None:
    """The config a checkpoint was trained with (None for one written before checkpoints recorded it)."""
    saved = Path(path) / CHECKPOINT_CONFIG
    return json.loads(saved.read_text()) if saved.is_file() else None


def recorded_config(stage_dir: Path) -> dict | None:
    """The config the newest readable checkpoint of a stage was trained with (what a resume continues), or None."""
    for path in reversed(list_checkpoints(Path(stage_dir) / "checkpoints")):
        try:
            return saved_config(path)
        except (OSError, ValueError):  # a damaged checkpoint: resume skips it too
            continue
    return None


def flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


ABSENT = object()


def config_changes(saved: dict, now: dict, allowed: tuple, same=lambda key, old, new: False) -> list[str]:
    """`key: old -> new` for every key that differs and is not under an allowed prefix, unless `same(key, old,
    new)` says the difference changes nothing (old is ABSENT for a key the saved config lacks)."""
    before, after = flatten(saved), flatten(now)
    free = lambda key: any(key == a or key.startswith(a + ".") for a in allowed)  # noqa: E731
    return [f"{k}: {before.get(k, '(absent)')} -> {after.get(k, '(absent)')}"
            for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k) and not free(k) and not same(k, before.get(k, ABSENT), after.get(k))]


def unchanged_in_effect(key: str, old, new, algo_kind: str) -> bool:
    """Differences a resume may ignore: a key added to rlft since the checkpoint, at its schema default, and a
    defaults-table key this run never reads (null now, rlft/config/defaults.py) that an older rlft recorded."""
    from rlft.config.defaults import TABLE_KEYS
    from rlft.config.schema import schema_default

    if old is ABSENT:
        return new == schema_default(key, algo_kind)
    return new is None and key in TABLE_KEYS


def check_resume_config(saved: dict | None, cfg, path: Path) -> None:
    """Refuse a resume whose config changed what the checkpoint was trained with (unless the keys
    are listed in resume_allow_changes, which is then said)."""
    from omegaconf import OmegaConf

    if saved is None:
        dist.print0(f"[rlft] {path} records no config (older rlft): the resumed config is not compared")
        return
    now = OmegaConf.to_container(cfg, resolve=True)
    saved = {RENAMED_SECTIONS.get(key, key): value for key, value in saved.items()}
    kind = str(getattr(cfg.algo, "kind", ""))
    changed = config_changes(saved, now, resume_free_keys(), lambda k, old, new: unchanged_in_effect(k, old, new, kind))
    accepted = [c for c in changed if any(c.split(":")[0] == a or c.startswith(a + ".")
                                          for a in map(str, cfg.resume_allow_changes))]
    refused = [c for c in changed if c not in accepted]
    if refused:
        keys = ",".join(c.split(":")[0] for c in refused)
        raise StageError(f"resume=true with a config that differs from the checkpoint's ({'; '.join(refused)}); "
                         f"rerun with the checkpoint's values, or accept them with resume_allow_changes=[{keys}]")
    for change in accepted:
        dist.print0(f"[rlft] resumed with a changed config (resume_allow_changes): {change}")
