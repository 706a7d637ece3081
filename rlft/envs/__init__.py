"""Environments: where the rows come from, how a trajectory goes on, and how it is judged.

    env=math            today's single-turn answer check (built-in task, GSM8K-format data)
    env=calculator      GSM8K's calculator: `<<expr=` is answered with `result>>` (multi-turn)
    env=python          fenced python blocks run in a sandboxed subprocess (multi-turn tool use)
    env=reasoning_gym   the procedural tasks of the reasoning-gym package, with their own scorers
    env.name=pkg.module:MyEnv   a user environment (a subclass of rlft.envs.Environment)

Every sampling stage builds the environment with `build(cfg)` and asks it, never a verifier, whether
an answer is right. The interface is in rlft/envs/base.py; docs/environments.md explains it.
"""
from __future__ import annotations

from rlft.envs.base import Environment, Reply, Score
from rlft.registry import UnknownNameError, import_path

BUILTIN = {
    "math": "rlft.envs.math:MathEnv",
    "calculator": "rlft.envs.calculator:CalculatorEnv",
    "python": "rlft.envs.python_tool:PythonEnv",
    "reasoning_gym": "rlft.envs.gym:ReasoningGymEnv",
}

__all__ = ["BUILTIN", "Environment", "Reply", "Score", "build", "env_class"]


def env_class(name: str) -> type:
    """The class behind `env.name`: a built-in name or `package.module:Class` (a one-line error otherwise)."""
    cls, module_name, attr = import_path(BUILTIN.get(name, name), "environment",
                                         f"{', '.join(BUILTIN)} or an import path 'package.module:Class'")
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UnknownNameError(f"environment '{name}': {module_name}.{attr} is not a subclass of "
                               "rlft.envs.Environment")
    return cls


def build(cfg, tokenizer=None) -> Environment:
    """The environment `env.name` names, built from the run's config; a stage that samples or encodes
    passes the policy's tokenizer (`Environment.use_tokenizer`)."""
    env = env_class(str(cfg.env.name))(cfg)
    if tokenizer is not None:
        env.use_tokenizer(tokenizer)
    return env
