"""Stage recipes, one module each. `run_stage` runs the function the algorithm table
(rlft.config.algorithms.ALGOS) names for `cfg.algo.kind`."""
from __future__ import annotations

from importlib import import_module


def run_stage_function(cfg, ctx) -> dict:
    """`module:function` of the algorithm's table entry, called with (cfg, ctx)."""
    from rlft.config.algorithms import algo_spec

    module, function = algo_spec(cfg.algo).stage.split(":")
    return getattr(import_module(f"rlft.stages.{module}"), function)(cfg, ctx)
