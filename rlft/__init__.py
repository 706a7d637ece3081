"""rlft: post-training for causal language models (SFT, reward models, GRPO, PPO, P3O, DPO, RFT).

Command line: `rlft --help`. Layout: config.py (schema), cli.py/launch.py/worker.py (driver and
ranks), engine/ (DeepSpeed), stages/ (recipes), algos/ (pure loss and advantage functions),
data/ (tasks, loading, tokenisation), rollout/ (generation), rewards/, eval/.
"""
__version__ = "0.1.0"
