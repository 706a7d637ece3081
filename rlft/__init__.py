"""rlft: post-training for causal language models (SFT, reward models, GRPO, PPO, P3O, DPO, RFT).

Command line: `rlft --help`. Layout: config/ (schema, validation), cli.py/launch.py/worker.py (driver and
ranks), trainer/ (DeepSpeed), files/ (a run on disk), stages/ (recipes), algos/ (pure loss and advantage
functions), data/ (tasks, loading, tokenisation), rollout/ (generation), rewards/, eval/.
"""
import logging

__version__ = "0.1.0"

# bitsandbytes (QLoRA) logs at import, on CPUs with AVX512-BF16, that an optional kernel from the Hub is
# missing; rlft does not use it, and the line would break rlft's one-line error messages.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
