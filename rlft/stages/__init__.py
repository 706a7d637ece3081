"""Stage recipes, one module each; `STAGES` maps an algorithm name to its `run(cfg, ctx)`."""
from __future__ import annotations

from importlib import import_module

from rlft.registry import Registry

STAGES = Registry("algorithm")


def _lazy(module: str, attr: str = "run"):
    def run(cfg, ctx):
        return getattr(import_module(f"rlft.stages.{module}"), attr)(cfg, ctx)
    run.__name__ = f"{module}.{attr}"
    return run


STAGES.register("sft")(_lazy("sft"))
STAGES.register("rm")(_lazy("reward"))
STAGES.register("prm")(_lazy("reward"))
STAGES.register("grpo")(_lazy("rl"))
STAGES.register("online_rft")(_lazy("rl"))
STAGES.register("rft")(_lazy("rft"))
STAGES.register("dpo")(_lazy("dpo"))
STAGES.register("ppo")(_lazy("rl"))
STAGES.register("p3o")(_lazy("rl"))
STAGES.register("online_dpo")(_lazy("rl"))
