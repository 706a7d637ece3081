"""Checking command-line overrides before Hydra runs, so mistakes cost seconds and one line.

Hydra would also reject an unknown key or option, but with a multi-line report and only after
start-up; here the message names the valid choices (and the closest match).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from enum import Enum
from pathlib import Path

from rlft.config.algorithms import ALGO_SCHEMAS
from rlft.config.schema import RENAMED_SECTIONS, SECTIONS
from rlft.errors import ConfigError

GROUP_KEYS = ("algo", "model", "data", "reward", "env", "deepspeed", "logger", "experiment")


def conf_dir() -> Path:
    """conf/ beside the package (source checkout) or inside it (wheel install)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"rlft's conf/ directory was not found next to {here}")


# The user's own config folders named on the command line (`hydra.searchpath=[file://<dir>]`, `--config-dir <dir>`):
# Hydra composes from them as well as from conf/, so their recipes and presets are options like rlft's own.
USER_CONFIG_DIRS: list[Path] = []


def user_config_dirs(args: list[str]) -> list[Path]:
    """The folders `--config-dir`/`-cd` and `hydra.searchpath=[file://...]` name in the arguments."""
    dirs = []
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(args[i + 1])
        elif arg.startswith(("--config-dir=", "-cd=")):
            dirs.append(arg.split("=", 1)[1])
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            value = arg.split("=", 1)[1].strip("[]")
            dirs += [v.strip()[len("file://"):] for v in value.split(",") if v.strip().startswith("file://")]
    return [Path(d).expanduser() for d in dirs]


def option_file(group: str, option: str) -> Path:
    """<group>/<option>.yaml in the user's config folders, else in conf/ (which may not have it)."""
    for directory in [*USER_CONFIG_DIRS, conf_dir()]:
        if (directory / group / f"{option}.yaml").is_file():
            return directory / group / f"{option}.yaml"
    return conf_dir() / group / f"{option}.yaml"


def group_options(group: str) -> list[str]:
    return sorted({p.stem for directory in [*USER_CONFIG_DIRS, conf_dir()] for p in (directory / group).glob("*.yaml")})


def option_description(group: str, option: str) -> str:
    """The first sentence(s) of conf/<group>/<option>.yaml's leading comment: its first paragraph,
    up to a line that starts a command example."""
    path = option_file(group, option)
    parts = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if not text or text.startswith(("rlft ", "bash ", "python ")):
            if parts:
                break
            continue
        parts.append(text)
    return " ".join(parts)


def algo_kind(preset: str) -> str | None:
    """The training loop conf/algo/<preset>.yaml picks (`/algo_schema/<kind>@algo`), if it exists."""
    from omegaconf import OmegaConf

    path = option_file("algo", preset)
    if not path.is_file():
        return None
    for entry in OmegaConf.load(path).get("defaults") or []:
        if isinstance(entry, str) and entry.startswith("/algo_schema/") and entry.endswith("@algo"):
            return entry[len("/algo_schema/"):-len("@algo")]
    return None


# Keys that moved to their own section: the error for the old name names the new one.
MOVED = {f"algo.{old}": new for old, new in {
    "prompts_per_step": "rollout.prompts_per_step", "samples_per_prompt": "rollout.samples_per_prompt",
    "dynamic_sampling": "rollout.dynamic_sampling", "max_sampling_rounds": "rollout.max_sampling_rounds",
    "critic_init": "critic.init", "critic_lr": "critic.lr", "value_clip": "critic.value_clip",
    "gamma": "critic.gamma", "lam": "critic.lam", "whiten_advantages": "critic.whiten_advantages",
    "p3o_clip_mode": "algo.pairwise_loss", "p3o_c": "pairwise.c", "p3o_kl_at": "pairwise.kl_at",
    "dpo_length_normalize": "pairwise.length_normalize", "iterations": "iterative.iterations",
    "rm_replay_ratio": "iterative.replay_ratio", "rm_steps_per_iteration": "iterative.rm_steps",
    "rm_lr": "iterative.rm_lr", "prm_label_completions": "iterative.label_completions",
    "prm_label_budget": "iterative.label_budget"}.items()}


def experiment_algo(name: str) -> str | None:
    """The algorithm conf/experiment/<name>.yaml selects (`override /algo: <name>`), if any."""
    from omegaconf import OmegaConf

    path = option_file("experiment", name)
    if not path.is_file():
        return None
    for entry in OmegaConf.load(path).get("defaults") or []:
        if isinstance(entry, dict) or OmegaConf.is_dict(entry):
            for key, value in dict(entry).items():
                if key.split("/")[-1] == "algo" and isinstance(value, str):
                    return value
    return None


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _values(override) -> list[str]:
    if override.is_sweep_override():
        try:
            return [str(v) for v in override.sweep_string_iterator()]
        except Exception:  # range/interval sweeps: nothing to check against options
            return []
    value = override.value()
    return [str(value)] if not isinstance(value, (list, dict)) else []


def _field_names(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def _check_path(section: str, schema: type, parts: list[str], full_key: str, label: str,
                values: list[str] = ()) -> None:
    """Walk parts through nested dataclasses; dict-typed fields accept any sub-key. A fixed-choice
    (Enum) field's values are checked here too: OmegaConf would refuse them as well, but in a
    six-line report after Hydra starts, where this is one line naming the valid values."""
    hints = typing.get_type_hints(schema)
    name, rest = parts[0], parts[1:]
    if name not in hints:
        names = _field_names(schema)
        raise ConfigError(f"unknown config key '{full_key}'{_suggest(name, names)}; "
                          f"valid keys in {label}: {', '.join(names)}")
    hint = hints[name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and len(args) == 2 and type(None) in args:  # Optional[X]: X or null
        hint = next(a for a in args if a is not type(None))
        values = [v for v in values if v not in ("null", "None")]
    if not rest and hint in (int, float, bool):
        for value in values:
            if not _parses(value, hint):
                raise ConfigError(f"{full_key}={value!r} is not a valid {hint.__name__}")
    if not rest and isinstance(hint, type) and issubclass(hint, Enum):
        valid = [m.value for m in hint]
        for value in values:
            if value not in valid:
                raise ConfigError(f"{full_key}={value!r} is not valid; choose one of: {', '.join(valid)}")
    if rest and dataclasses.is_dataclass(hint):
        _check_path(section, hint, rest, full_key, f"{label}.{name}", values)
    elif rest and typing.get_origin(hint) not in (dict,) and hint is not dict:
        raise ConfigError(f"config key '{full_key}': {label}.{name} has no sub-keys")


def _parses(value: str, kind: type) -> bool:
    """Whether an override's value converts to `kind` (an interpolation `${...}` is left to Hydra)."""
    if value.startswith("${") or value in ("null", "None"):
        return True
    if kind is bool:
        return value.lower() in ("true", "false")
    try:
        kind(value) if kind is float else int(value)
    except ValueError:
        return False
    return True


# Hydra's own output keys that rlft's layout replaces (its sweep keys work: hydra.sweep.dir holds summary.csv)
UNUSED_HYDRA_KEYS = {
    "hydra.run.dir": "a stage writes under run.root/run.name/<algo>; set run.root=<folder> or run.dir=<folder>",
    "hydra.output_subdir": "the resolved config is the stage's own config.yaml",
    "hydra.job.chdir": "rlft keeps the working directory (relative paths in the config stay valid)",
}


def free_form_dicts() -> set[str]:
    """Config keys whose value is the user's own mapping (a dict-typed field: env.task_config, env.options)."""
    out = set()
    for section, schema in SECTIONS.items():
        if dataclasses.is_dataclass(schema):
            out |= {f"{section}.{name}" for name, hint in typing.get_type_hints(schema).items()
                    if hint is dict or typing.get_origin(hint) is dict}
    return out


def replace_dicts(args: list[str]) -> list[str]:
    """`key={...}` for a free-form dict key as `++key={...}`: the mapping replaces the default, where Hydra
    would merge it into the (empty, struct) default and refuse every new key."""
    keys = free_form_dicts()
    return [f"++{arg}" if arg.split("=", 1)[0] in keys and "=" in arg else arg for arg in args]


def set_dicts_as_given(cfg, overrides: list[str]) -> None:
    """Hydra merges a `key={...}` override into the mapping a recipe set (`experiment=smollm2_sft
    env.task=leg_counting env.task_config={min_animals:1}` would keep the recipe's chain_sum options): set each
    free-form mapping the command line names to exactly what it says."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    keys = free_form_dicts()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group.lstrip("+~")
        if key in keys and not override.is_sweep_override() and isinstance(override.value(), dict):
            OmegaConf.update(cfg, key, override.value(), merge=False)


def check_overrides(args: list[str]) -> None:
    """Raise ConfigError for an unknown group option or config key in Hydra-style overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException as exc:
        raise ConfigError(f"cannot parse the overrides: {' '.join(str(exc).split())}") from None
    algos = ["sft"]
    for o in parsed:  # an experiment may choose the algorithm; an explicit algo= wins
        if o.key_or_group.lstrip("+") == "experiment":
            algos = [a for v in _values(o) for a in [experiment_algo(v)] if a] or algos
    for o in parsed:
        if o.key_or_group == "algo":
            algos = _values(o) or algos
    for o in parsed:
        key = o.key_or_group
        if key.lstrip("+") in UNUSED_HYDRA_KEYS:
            raise ConfigError(f"{key.lstrip('+')} is not used by rlft: {UNUSED_HYDRA_KEYS[key.lstrip('+')]}")
        if key.startswith("hydra") or o.is_delete() or (o.is_add() and "." in key):
            continue
        old = key.lstrip("+").split(".")[0]
        if old in RENAMED_SECTIONS:
            new, values = RENAMED_SECTIONS[old] + key.lstrip("+")[len(old):], _values(o)
            shown = lambda k: f"{k}={values[0]}" if len(values) == 1 else k  # noqa: E731
            section = RENAMED_SECTIONS[old]
            raise ConfigError(f"'{shown(key)}' is now '{shown(new)}' (the section `{old}` is now `{section}`: "
                              f"{section}=<option>, {section}.<key>; see `rlft list keys {section}`)")
        if key in GROUP_KEYS:
            options = group_options(key)
            for value in _values(o):
                if value not in options:
                    raise ConfigError(f"unknown {key} '{value}'{_suggest(value, options)}; "
                                      f"valid: {', '.join(options)} (see `rlft list {key}`; a file of your own: "
                                      f"--config-dir <folder> holding {key}/{value}.yaml)")
            continue
        section, *rest = key.split(".")
        if section not in SECTIONS:
            raise ConfigError(f"unknown config key '{key}'{_suggest(section, list(SECTIONS))}; "
                              f"top-level keys: {', '.join(SECTIONS)}")
        if not rest:
            continue
        if key in MOVED:
            raise ConfigError(f"'{key}' is now '{MOVED[key]}' (see `rlft list keys {MOVED[key].split('.')[0]}`)")
        if section == "algo":
            for algo in algos:
                kind = algo_kind(algo)
                if kind in ALGO_SCHEMAS:
                    _check_path(section, ALGO_SCHEMAS[kind], rest, key, f"algo={algo}", _values(o))
            continue
        schema = SECTIONS[section]
        if not dataclasses.is_dataclass(schema):
            raise ConfigError(f"config key '{key}': '{section}' has no sub-keys")
        _check_path(section, schema, rest, key, section, _values(o))
