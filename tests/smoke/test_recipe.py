"""The real-model recipe (experiment=qwen_gsm8k_sft, then experiment=qwen_gsm8k_grpo) end to end on
local GSM8K-format rows and a tiny model of the same architecture (Qwen2, with a chat template), at
test sizes: the recipe's own groups and settings are used, only the model path, the data source,
the sizes and the precision (fp32 on CPU) are overridden."""
from __future__ import annotations

import json

import torch
from omegaconf import OmegaConf

from helpers import USER_REWARD, check_ok, load_safetensors, read_manifest, rl_env, run_cli, stage_dir

CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
COMMON = ["deepspeed.precision=fp32", "deepspeed.threads_per_rank=1", "logger.wandb=disabled", "logger.progress=false",
          "data.name=null", "train.max_seq_len=256", "train.log_every=1", "train.save_every=0"]


def gsm8k_dir(root):
    rows = [{"question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?",
             "answer": f"He has {i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3} apples.\n#### {2 * i + 3}"}
            for i in range(24)]
    root.mkdir()
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:16]))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[16:]))
    return root


def tiny_qwen2(root):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlft.data.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = CHAT
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(root)
    tok.save_pretrained(root)
    return root


def test_recipe_names_the_real_model_and_data(tmp_path):
    proc = check_ok(run_cli(tmp_path, "train", "experiment=qwen_gsm8k_grpo", "--cfg", "job"))
    assert "path: Qwen/Qwen2.5-0.5B-Instruct" in check_ok(
        run_cli(tmp_path, "train", "experiment=qwen_gsm8k_sft", "--cfg", "job")).stdout
    assert "source: openai/gsm8k" in proc.stdout and "precision: bf16" in proc.stdout
    assert "name: grpo" in proc.stdout and "zero_stage: 2" in proc.stdout
    lora = check_ok(run_cli(tmp_path, "train", "experiment=qwen_gsm8k_grpo_lora", "--cfg", "job")).stdout
    assert "path: Qwen/Qwen2.5-7B-Instruct" in lora and "rank: 64" in lora and "engine: vllm" in lora
    assert "source: openai/gsm8k" in lora and "activation_checkpointing: true" in lora


def test_recipe_sft_then_grpo_then_eval_on_a_tiny_qwen2(tmp_path):
    data, model = gsm8k_dir(tmp_path / "gsm8k"), tiny_qwen2(tmp_path / "tiny-qwen2")
    run = ["run.name=qwen", f"data.source={data}", *COMMON]
    check_ok(run_cli(tmp_path, "train", "experiment=qwen_gsm8k_sft", f"model.path={model}", *run,
                     "train.max_steps=2", "train.batch_size=8", "train.micro_batch_per_device=4"))
    check_ok(run_cli(tmp_path, "train", "experiment=qwen_gsm8k_grpo", *run, "train.max_steps=2",
                     "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=16",
                     "rollout.batch_size=8", "algo.eval_every=0", "algo.eval_problems=4",
                     "train.micro_batch_per_device=8", f"reward.functions=[{USER_REWARD}:alternate]",
                     timeout=600, env=rl_env()))
    sft, grpo = stage_dir(tmp_path, "qwen", "sft"), stage_dir(tmp_path, "qwen", "grpo")
    for stage in (sft, grpo):
        assert read_manifest(stage)["completed"] is True
        assert json.loads((stage / "final" / "config.json").read_text())["model_type"] == "qwen2"
    assert read_manifest(grpo)["parent"].endswith("qwen/sft/final")
    before, after = load_safetensors(sft / "final"), load_safetensors(grpo / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    check_ok(run_cli(tmp_path, "eval", "experiment=qwen_gsm8k_grpo", *run, "eval.models=[stage:sft,stage:grpo]",
                     "eval.num_problems=4", "eval.samples=2", "eval.k=[1,2]", "eval.max_new_tokens=16",
                     "eval.policy_samples=2"))
    table = (tmp_path / "runs" / "qwen" / "eval" / "comparison.md").read_text()
    assert "| sft |" in table and "| grpo |" in table


def test_a_pretrained_model_without_a_recipe_gets_the_tables_pretrained_rates(tmp_path):
    """README's 'Your model' path: `algo=sft model=hf model.path=X`, then `algo=grpo` (LoRA) from it, with no
    experiment=; the header prints each rate and size with where it came from."""
    data, model = gsm8k_dir(tmp_path / "gsm8k"), tiny_qwen2(tmp_path / "tiny-qwen2")
    run = ["run.name=mine", "model=hf", "data=jsonl", f"data.source={data}", *COMMON]
    sft = check_ok(run_cli(tmp_path, "train", "algo=sft", f"model.path={model}", *run, "train.max_steps=1")).stdout
    assert "[rlft] defaults table: pretrained model, sft, full fine-tuning: TRL SFTConfig's lr 2e-5" in sft
    assert "[rlft] train.lr=2e-05 (defaults table)" in sft and "[rlft] train.batch_size=32 (defaults table)" in sft
    assert "train.max_steps=1 (command line)" in sft
    grpo = check_ok(run_cli(tmp_path, "train", "algo=grpo", "model.path=stage:sft", "model.lora.rank=4", *run,
                            "train.max_steps=1", "rollout.prompts_per_step=2", "rollout.max_new_tokens=8",
                            "algo.eval_every=0", "algo.eval_problems=2", f"reward.functions=[{USER_REWARD}:alternate]",
                            timeout=600, env=rl_env())).stdout
    assert "pretrained model, rl, LoRA (lr x 10)" in grpo and "[rlft] train.lr=1e-05 (defaults table)" in grpo
    assert "rollout: 2 prompts (command line) x 8 samples (algo=grpo), 8 new tokens (command line)" in grpo
    recorded = OmegaConf.load(stage_dir(tmp_path, "mine", "grpo") / "config.yaml")
    assert recorded.train.lr == 1e-5 and recorded.model.kind == "pretrained"  # the values it ran with, recorded
