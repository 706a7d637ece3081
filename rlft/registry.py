"""Name -> function registries.

Every algorithmic choice in rlft (advantage estimator, policy loss, KL estimator,
loss aggregation, ...) is a plain function registered by name in a `Registry`.
Each registry documents ONE call signature that all of its entries obey, so the
training loop looks a function up by the configured name and calls it without
ever branching on which algorithm it is.

    ADVANTAGES = Registry("advantage estimator")

    @ADVANTAGES.register("grpo")
    def grpo(batch, cfg): ...

    fn = ADVANTAGES.get(cfg.estimator)   # UnknownNameError lists the valid names
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterator, TypeVar

from rlft.errors import UnknownNameError

F = TypeVar("F", bound=Callable)


def import_path(spec: str, what: str, valid: str) -> tuple[object, str, str]:
    """(the object `package.module:name` names or None when the module lacks it, module, name); a one-line
    UnknownNameError for a spec that is no import path (listing `valid`) or a module that does not import."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise UnknownNameError(f"unknown {what} '{spec}'; valid: {valid}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownNameError(f"{what} '{spec}': cannot import {module_name} ({exc})") from None
    return getattr(module, attr, None), module_name, attr


class Registry:
    """A named mapping from string keys to functions of one shared signature."""

    def __init__(self, kind: str):
        self.kind = kind  # human-readable, used in error messages ("advantage estimator")
        self._entries: dict[str, Callable] = {}
        self._meta: dict[str, dict] = {}

    def register(self, name: str, **meta) -> Callable[[F], F]:
        """Decorator that registers a function under `name` and returns it unchanged. `meta` says
        what the entry needs from its caller (e.g. needs=("critic",)); read it with `meta(name)`."""

        def decorator(fn: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = fn
            self._meta[name] = meta
            return fn

        return decorator

    def meta(self, name: str) -> dict:
        """What `name` was registered with (empty when nothing); UnknownNameError for an unknown name."""
        self.get(name)
        return self._meta[name]

    def needs(self, name: str, what: str) -> bool:
        """Whether entry `name` declared `what` among its needs."""
        return what in self.meta(name).get("needs", ())

    def names_needing(self, what: str, present: bool = True) -> list[str]:
        """The names that declare (or, with present=False, do not declare) `what` among their needs."""
        return [n for n in self.names() if self.needs(n, what) == present]

    def get(self, name: str) -> Callable:
        """The function registered as `name`; `UnknownNameError` (a KeyError) otherwise."""
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names())
            raise UnknownNameError(f"unknown {self.kind} '{name}'; valid: {valid}") from None

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
