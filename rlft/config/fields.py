"""Fixed string choices, and the declaration of which runs read an option."""
from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any


class Choice(str, Enum):
    """A fixed set of string values that OmegaConf checks itself: a wrong value is refused with the
    key and the valid values. (Choices that grow by registration, e.g. algo.advantage, are checked
    against their registry in `validate`.)"""

    def __str__(self) -> str:
        return self.value


def choices(name: str, values: str) -> type:
    return Choice(name, [(v, v) for v in values.split()])


LRSchedule = choices("LRSchedule", "cosine linear constant")
Precision = choices("Precision", "fp32 bf16")
Backend = choices("Backend", "auto gloo nccl")
Device = choices("Device", "auto cpu cuda")
HFCache = choices("HFCache", "static dynamic")
ISLevel = choices("ISLevel", "token sequence")
TruncationPolicy = choices("TruncationPolicy", "keep zero_reward mask penalty")
NonFinitePolicy = choices("NonFinitePolicy", "error zero")
NonFinite = choices("NonFinite", "stop drop")
FusedLoss = choices("FusedLoss", "rlft liger")
WandbMode = choices("WandbMode", "auto online offline disabled")
KLIn = choices("KLIn", "loss reward")
RewardSource = choices("RewardSource", "data policy")
StepLabels = choices("StepLabels", "exact mc")
StepScorer = choices("StepScorer", "prm exact")
KLAt = choices("KLAt", "old current")
ModelKind = choices("ModelKind", "auto builtin pretrained")
SpecialTokensInText = choices("SpecialTokensInText", "literal parse")


def read_when(rule: str, default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A field that only some runs read. `rule` names an entry of `rlft.config.validate.READ_RULES`, which
    says when it is read; a run that sets the option (a value other than the schema's default) but never
    reads it is refused in one line. A section can declare one rule for all its fields with a class
    attribute `READ_WHEN: ClassVar[str]`."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"read_when": rule})


def free_on_resume(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A field that does not change what is trained (how long, how often to log or save, where and with how many
    threads it runs): `resume=true` accepts a value that differs from the checkpoint's. A whole section declares
    it with a class attribute `FREE_ON_RESUME: ClassVar[bool] = True`; every other option must match."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"free_on_resume": True})


def read_rule(schema: type, field: dataclasses.Field) -> str | None:
    """The rule a field declares (its own, else its section's READ_WHEN), or None: every run reads it."""
    return field.metadata.get("read_when") or getattr(schema, "READ_WHEN", None)
