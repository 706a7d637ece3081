"""Checking command-line overrides before Hydra runs, so mistakes cost seconds and one line.

Hydra would also reject an unknown key or option, but with a multi-line report and only after
start-up; here the message names the valid choices (and the closest match).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from rlft.config import ALGO_SCHEMAS, SECTIONS, ConfigError

GROUP_KEYS = ("algo", "model", "data", "reward", "engine", "logger", "experiment")


def conf_dir() -> Path:
    """conf/ beside the package (source checkout) or inside it (wheel install)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"rlft's conf/ directory was not found next to {here}")


def group_options(group: str) -> list[str]:
    directory = conf_dir() / group
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []


def option_description(group: str, option: str) -> str:
    """The first comment line of conf/<group>/<option>.yaml."""
    path = conf_dir() / group / f"{option}.yaml"
    for line in path.read_text().splitlines():
        text = line.lstrip("# ").strip()
        if line.startswith("#") and text and not text.startswith("@package"):
            return text
    return ""


def experiment_algo(name: str) -> str | None:
    """The algorithm conf/experiment/<name>.yaml selects (`override /algo: <name>`), if any."""
    from omegaconf import OmegaConf

    path = conf_dir() / "experiment" / f"{name}.yaml"
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


def _check_path(section: str, schema: type, parts: list[str], full_key: str, label: str) -> None:
    """Walk parts through nested dataclasses; dict-typed fields accept any sub-key."""
    hints = typing.get_type_hints(schema)
    name, rest = parts[0], parts[1:]
    if name not in hints:
        names = _field_names(schema)
        raise ConfigError(f"unknown config key '{full_key}'{_suggest(name, names)}; "
                          f"valid keys in {label}: {', '.join(names)}")
    hint = hints[name]
    if rest and dataclasses.is_dataclass(hint):
        _check_path(section, hint, rest, full_key, f"{label}.{name}")
    elif rest and typing.get_origin(hint) not in (dict,) and hint is not dict:
        raise ConfigError(f"config key '{full_key}': {label}.{name} has no sub-keys")


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
        if key.startswith("hydra") or o.is_delete() or (o.is_add() and "." in key):
            continue
        if key in GROUP_KEYS:
            options = group_options(key)
            for value in _values(o):
                if value not in options:
                    raise ConfigError(f"unknown {key} '{value}'{_suggest(value, options)}; "
                                      f"valid: {', '.join(options)} (see `rlft list {key}`)")
            continue
        section, *rest = key.split(".")
        if section not in SECTIONS:
            raise ConfigError(f"unknown config key '{key}'{_suggest(section, list(SECTIONS))}; "
                              f"top-level keys: {', '.join(SECTIONS)}")
        if not rest:
            continue
        if section == "algo":
            for algo in algos:
                if algo in ALGO_SCHEMAS:
                    _check_path(section, ALGO_SCHEMAS[algo], rest, key, f"algo={algo}")
            continue
        schema = SECTIONS[section]
        if not dataclasses.is_dataclass(schema):
            raise ConfigError(f"config key '{key}': '{section}' has no sub-keys")
        _check_path(section, schema, rest, key, section)
