"""Learning rates, batch shapes and run lengths that fit the model: the defaults table.

An `algo=` preset says what the algorithm is (its `algo.*`, its critic, pair or group structure). How fast
and on how much a stage trains depends on the model as much as on the algorithm, so those keys (TABLE_KEYS)
are null in the schema and filled here, from one of two tables:

* the built-in model (`builtin:tiny` and every stage trained from it): the sizes each preset was tuned at on
  the built-in task (docs/results.md), one row per preset, else per training loop;
* a pretrained model (a hub id, a Hugging Face folder, a GGUF file, an adapter folder): what practitioners
  use for full fine-tuning, one row per training loop, with its source; with LoRA the learning rate is ten
  times higher.

Anything set in a recipe (`experiment=`), a preset or on the command line wins over the table. On
`resume=true` an unset key takes the value the checkpoint was trained with, so a run resumes as it started
even when the table has changed since. The run header prints the learning rate and the batch with where
each came from (`header_lines`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from rlft.config.algorithms import algo_spec

# Keys the table fills when the composed config leaves them null.
TABLE_KEYS = ("train.lr", "train.max_steps", "train.batch_size", "train.micro_batch_per_device",
              "train.warmup_steps", "train.lr_schedule", "train.weight_decay", "train.log_every",
              "train.save_every", "rollout.prompts_per_step", "rollout.max_new_tokens", "critic.lr",
              "iterative.rm_lr")

# What every row starts from (a row names only what differs).
BASE = {"train.lr": 1e-3, "train.max_steps": 200, "train.batch_size": 32, "train.micro_batch_per_device": 8,
        "train.warmup_steps": 10, "train.lr_schedule": "cosine", "train.weight_decay": 0.0,
        "train.log_every": 10, "train.save_every": 100, "rollout.prompts_per_step": 16,
        "rollout.max_new_tokens": 96, "critic.lr": 1e-4, "iterative.rm_lr": 2e-4}

_TINY_RL = {"train.lr": 1e-4, "train.max_steps": 300, "train.warmup_steps": 5, "train.lr_schedule": "constant",
            "train.micro_batch_per_device": 64, "train.save_every": 50, "rollout.prompts_per_step": 32,
            "rollout.max_new_tokens": 48}
_TINY_PAIRS = {**_TINY_RL, "train.max_steps": 200, "train.micro_batch_per_device": 32, "train.save_every": 100,
               "rollout.prompts_per_step": 64}
_TINY_LOO = {**_TINY_RL, "train.max_steps": 100, "rollout.prompts_per_step": 64}
_TINY_REWARD = {"train.lr": 5e-4, "train.micro_batch_per_device": 16, "train.max_steps": 150}

# The built-in model on the built-in task: each preset's tuned sizes (keyed by preset, else by loop). DPO's
# 3e-5: at 1e-4 the SFT model's own pairs (algo.source=policy) over-fit (2.3 nats from SFT, -1 point), at 3e-5
# they gain 7.5 points (docs/results.md, the equal-budget table).
BUILTIN: dict[str, dict] = {
    "sft": {"train.lr": 3e-3, "train.micro_batch_per_device": 16, "train.max_steps": 900, "train.warmup_steps": 30,
            "train.weight_decay": 0.1, "train.log_every": 50, "train.save_every": 300},
    "rm": _TINY_REWARD,
    "prm": _TINY_REWARD,
    "dpo": {"train.lr": 3e-5, "train.micro_batch_per_device": 16, "train.max_steps": 150,
            "train.lr_schedule": "constant", "train.save_every": 50},
    "rft": {"train.lr": 1e-4, "train.micro_batch_per_device": 32, "train.max_steps": 150, "train.warmup_steps": 5,
            "train.lr_schedule": "constant", "train.save_every": 50, "rollout.max_new_tokens": 48},
    "rl": _TINY_RL,
    "online_rft": {**_TINY_RL, "train.max_steps": 150},
    "ppo": _TINY_PAIRS,
    "p3o": _TINY_PAIRS,
    "online_dpo": _TINY_PAIRS,
    "rloo": _TINY_LOO,
    "reinforce_pp": _TINY_LOO,
}

# A pretrained model, full fine-tuning, per training loop: (row, where its rates come from).
PRETRAINED: dict[str, tuple[dict, str]] = {
    "sft": ({"train.lr": 2e-5, "train.max_steps": 300}, "TRL SFTConfig's lr 2e-5"),
    "rm": ({"train.lr": 1e-5}, "OpenRLHF's reward-model examples, lr 9e-6"),
    "prm": ({"train.lr": 1e-5}, "OpenRLHF's reward-model examples, lr 9e-6"),
    "dpo": ({"train.lr": 1e-6, "train.micro_batch_per_device": 4}, "TRL DPOConfig's lr 1e-6"),
    "rft": ({"train.lr": 1e-5, "rollout.max_new_tokens": 256}, "an SFT rate on the model's own samples"),
    "rl": ({"train.lr": 1e-6, "train.warmup_steps": 5, "train.lr_schedule": "constant", "train.log_every": 1,
            "train.save_every": 50, "rollout.max_new_tokens": 256, "critic.lr": 1e-5, "iterative.rm_lr": 1e-5},
           "TRL GRPOConfig's lr 1e-6, max_completion_length 256; OpenRLHF's critic lr 9e-6"),
}
LORA_LR_SCALE = 10.0  # LoRA adapters take about 10x the full fine-tuning rate (docs/lora.md)


@dataclass(frozen=True)
class ModelKind:
    builtin: bool
    lora: bool
    why: str
    """What made it this kind (the model path, or the stage it was trained from)."""

    def __str__(self) -> str:
        if self.builtin:
            return "the built-in model"
        return "a pretrained model" + (", LoRA" if self.lora else ", full fine-tuning")


def _recorded_start(stage_dir: Path) -> Optional[tuple[str, str]]:
    """(model.path, algo.init_from) a finished or running stage recorded in its config.yaml, if any."""
    from rlft.files import handoff

    recorded = handoff.stage_config(stage_dir)
    if recorded is None:
        return None
    return str(OmegaConf.select(recorded, "model.path", default="auto")), \
        str(OmegaConf.select(recorded, "algo.init_from", default="builtin:tiny"))


def _default_start(stage: str) -> str:
    """What a preset's stage starts from when its model.path is left at auto (its schema's init_from)."""
    from rlft.config.algorithms import ALGO_SCHEMAS
    from rlft.overrides import algo_kind

    kind = algo_kind(stage)
    return ALGO_SCHEMAS[kind]().init_from if kind in ALGO_SCHEMAS else "auto"


def starts_from_builtin(cfg, path: str, init_from: str, depth: int = 0) -> bool:
    """Whether `path` (a model.path) is the built-in model or was trained from it, following `stage:` names and
    stage folders (`runs/<run>/<stage>/final`) back through the config each stage recorded; a stage not trained
    yet is taken to start where its preset starts by default."""
    from rlft.files import handoff

    if path == "auto":
        path = init_from
    if path.startswith("builtin:"):
        return True
    if depth > 20 or path == "auto":
        return False
    stage = None
    if path.startswith(handoff.STAGE_PREFIX):
        stage = path[len(handoff.STAGE_PREFIX):]
        stage_dir = handoff.run_stage_dir(cfg, stage)
    else:
        local = Path(path).expanduser()
        stage_dir = local.parent if local.name == "final" else None
    start = _recorded_start(stage_dir) if stage_dir is not None else None
    if start is None and stage is not None:
        start = ("auto", _default_start(stage))
    return start is not None and starts_from_builtin(cfg, start[0], start[1], depth + 1)


def model_kind(cfg) -> ModelKind:
    """builtin or pretrained (model.kind, or what model.path is when auto) and whether LoRA trains it."""
    path, chosen = str(cfg.model.path), str(cfg.model.kind)
    lora = int(cfg.model.lora.rank) > 0
    if chosen != "auto":
        return ModelKind(chosen == "builtin", lora, f"model.kind={chosen}")
    return ModelKind(starts_from_builtin(cfg, path, str(cfg.algo.init_from)), lora, f"model.path={path}")


def table_row(cfg, kind: ModelKind) -> tuple[dict, str]:
    """The row of the table this run reads, and a description of it for the header."""
    loop = str(cfg.algo.kind)
    if kind.builtin:
        name = str(cfg.algo.name)
        if name in BUILTIN:
            return {**BASE, **BUILTIN[name]}, f"built-in model, as algo={name} was tuned"
        return {**BASE, **BUILTIN.get(loop, {})}, f"built-in model, as the {loop} presets were tuned"
    row, source = PRETRAINED.get(loop, ({}, "rlft's defaults"))
    row = {**BASE, **row}
    what = f"pretrained model, {loop}"
    if kind.lora:
        row["train.lr"] = float(f"{row['train.lr'] * LORA_LR_SCALE:.6g}")  # 1e-05, not 9.999999999999999e-06
        what += f", LoRA (lr x {LORA_LR_SCALE:g})"
    else:
        what += ", full fine-tuning"
    return row, f"{what}: {source}"


def fill(cfg, recorded: Optional[dict] = None, unread=lambda key: False) -> dict[str, str]:
    """Set every table key the composed config leaves null; returns key -> where its value came from. With
    `recorded` (a resumed checkpoint's config) a null key takes the recorded value. Keys `unread` says this run
    never reads stay null, as the schema has them (so the refusal of options set but never read stays quiet).
    The micro-batch, when the table sets it, is fitted to divide the per-rank batch. Idempotent."""
    missing = [k for k in TABLE_KEYS if OmegaConf.select(cfg, k) is None]
    if not missing:
        return {}
    kind = model_kind(cfg)
    row, _ = table_row(cfg, kind)
    sources = {}
    for key in missing:
        if key == "train.batch_size" and algo_spec(cfg.algo).rl:
            continue  # RL derives it from the rollout (config/arithmetic.py)
        if unread(key):
            continue
        value = _select(recorded, key) if recorded else None
        if value is not None:
            sources[key] = "the resumed checkpoint's config"
        else:
            value, sources[key] = row[key], "defaults table"
        OmegaConf.update(cfg, key, value, merge=False)
    if "train.micro_batch_per_device" in sources and not recorded:
        fitted = fit_micro_batch(cfg, per_rank_batch(cfg))
        if fitted is not None:
            sources["train.micro_batch_per_device"] += f", lowered to {fitted} to divide the step's batch"
    return sources


def per_rank_batch(cfg) -> int:
    """Sequences one rank trains on per optimizer step (RL: its share of a minibatch of the rollout)."""
    world = int(cfg.deepspeed.nproc_per_node) * int(cfg.deepspeed.nnodes)
    if algo_spec(cfg.algo).rl:
        rollout = int(cfg.rollout.prompts_per_step) * int(cfg.rollout.samples_per_prompt)
        return rollout // max(int(cfg.algo.minibatches_per_rollout), 1) // world
    return int(cfg.train.batch_size) // world


def _select(container: dict, key: str) -> Any:
    node: Any = container
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def fit_micro_batch(cfg, per_rank: int) -> Optional[int]:
    """When the micro-batch came from the table and does not divide this rank's share of the batch: the
    largest one below it that does (set in the config; returned), else None."""
    micro = int(cfg.train.micro_batch_per_device)
    if per_rank <= 0 or per_rank % micro == 0:
        return None
    divisors = [d for d in range(1, min(micro, per_rank) + 1) if per_rank % d == 0]
    if algo_spec(cfg.algo).rl and cfg.algo.pairwise_loss is not None:  # a pair stays in one micro-batch
        divisors = [d for d in divisors if d % 2 == 0] or divisors
    fitted = max(divisors)
    cfg.train.micro_batch_per_device = fitted
    return fitted


# ----------------------------------------------------------------------------- where a value came from
def _file_sets(path: Path, key: str, global_package: bool, conf: Path, depth: int = 0) -> bool:
    """Whether a config file (or a file it includes without `override`) sets `key`."""
    if not path.is_file() or depth > 10:
        return False
    text = path.read_text()
    node = OmegaConf.create(text) or OmegaConf.create({})
    if global_package or "@package _global_" in text.split("\n", 1)[0]:
        if OmegaConf.select(node, key, default=None) is not None:
            return True
    for entry in node.get("defaults") or []:
        entry = OmegaConf.to_container(entry) if not isinstance(entry, str) else entry
        if isinstance(entry, dict):
            (name, option), = entry.items()
            if str(name).startswith("override") or option is None:
                continue
            group, _, package = str(name).partition("@")
            target = conf / group.lstrip("/") / f"{option}.yaml"
            if _file_sets(target, key, package == "_global_", conf, depth + 1):
                return True
        elif isinstance(entry, str) and entry != "_self_":
            name, _, package = entry.partition("@")
            target = (conf / f"{name.lstrip('/')}.yaml") if name.startswith("/") else path.parent / f"{name}.yaml"
            if _file_sets(target, key, package == "_global_" or global_package, conf, depth + 1):
                return True
    return False


def source_of(key: str, overrides: list[str], choices: dict, filled: dict[str, str]) -> str:
    """Where a key's value came from: the command line, the recipe (`experiment=`), the algorithm's preset,
    the defaults table (or a resumed checkpoint), else the schema's default."""
    from rlft.overrides import conf_dir, option_file

    if key in filled:
        return filled[key]
    if any(o.lstrip("+~").split("=", 1)[0] == key for o in overrides):
        return "command line"
    conf = conf_dir()
    for group in ("experiment", "algo"):
        option = choices.get(group)
        if option and _file_sets(option_file(group, option), key, False, conf):
            return f"{group}={option}"
    return "config"


def header_lines(cfg, overrides: list[str], choices: dict, filled: dict[str, str]) -> list[str]:
    """The run header's provenance lines: the model kind, the learning rate and the batch, each with its source."""
    src = lambda key: source_of(key, overrides, choices, filled)  # noqa: E731
    kind = model_kind(cfg)
    lines = [f"defaults table: {table_row(cfg, kind)[1]} ({kind.why})",
             f"train.lr={cfg.train.lr:g} ({src('train.lr')})"]
    if algo_spec(cfg.algo).rl:
        lines.append(f"rollout: {cfg.rollout.prompts_per_step} prompts ({src('rollout.prompts_per_step')}) x "
                     f"{cfg.rollout.samples_per_prompt} samples ({src('rollout.samples_per_prompt')}), "
                     f"{cfg.rollout.max_new_tokens} new tokens ({src('rollout.max_new_tokens')})")
    else:
        lines.append(f"train.batch_size={cfg.train.batch_size} ({src('train.batch_size')})")
    lines.append(f"train.micro_batch_per_device={cfg.train.micro_batch_per_device} "
                 f"({src('train.micro_batch_per_device')}); train.max_steps={cfg.train.max_steps} "
                 f"({src('train.max_steps')})")
    return lines
