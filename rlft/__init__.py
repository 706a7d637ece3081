"""rlft: post-training for causal language models (SFT, reward models, GRPO, PPO, P3O, DPO, RFT).

Command line: `rlft --help`. Layout: config/ (schema, validation), cli.py/launch.py/worker.py (driver and
ranks), trainer/ (DeepSpeed), files/ (a run on disk), stages/ (recipes), algos/ (pure loss and advantage
functions), data/ (tasks, loading, tokenisation), rollout/ (generation), rewards/, eval/.
"""
import logging

__version__ = "0.1.0"

# bitsandbytes (QLoRA) logs at import, on CPUs with AVX512-BF16, that an optional kernel from the Hub is
# missing, and the `kernels` package it asks logs that it skips the publisher check offline; rlft uses neither
# (transformers imports bitsandbytes whenever it is installed), and the lines would break rlft's one-line errors.
for _name in ("bitsandbytes", "kernels"):
    logging.getLogger(_name).setLevel(logging.ERROR)
