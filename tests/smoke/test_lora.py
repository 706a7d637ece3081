"""LoRA adapters (model.lora.rank > 0) in every stage: only the adapter (and a reward model's head)
trains, final/ is a plain transformers model equal to parent + adapter, the adapter is saved beside it
in peft's format (merge_and_unload of base + adapter is final/), an adapter folder is a model.path, RL's
reference is the base model with the adapter off, ZeRO-3 on 2 ranks and exact resume work."""
from __future__ import annotations

import json

import torch

from helpers import (RL_SMALL, TINY, USER_REWARD, check_ok, load_safetensors, make_parents, read_metrics, rl_cli,
                     rl_env, run_cli, stage_dir)

RUN = "lo"
LORA = ["model.lora.rank=4", "model.lora.alpha=8"]
SMALL = ["train.batch_size=8", "train.micro_batch_per_device=8", "train.log_every=1", "train.save_every=0",
         "train.lr=1e-2"]


def load_adapter(adapter_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors"))


def merged_from_adapter(parent: dict, adapter_dir) -> dict:
    """parent's weights with the saved adapter merged in: W + (alpha / r) B A for every adapted layer."""
    import json

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    adapter = load_adapter(adapter_dir)
    out = dict(parent)
    for key in adapter:
        if ".lora_A." in key:
            module = key[len("base_model.model."):].split(".lora_A.")[0]
            a, b = adapter[key], adapter[key.replace(".lora_A.", ".lora_B.")]
            out[f"{module}.weight"] = parent[f"{module}.weight"] + scale * (b @ a)
    return out


def check_only_adapter_trained(final_dir, parent_dir, head: str | None = None) -> None:
    """final == parent + adapter, except the reward head (trained); no adapter tensor in final/."""
    final, parent = load_safetensors(final_dir), load_safetensors(parent_dir)
    assert not any("lora" in k for k in final)
    expected = merged_from_adapter(parent, final_dir.with_name(final_dir.name + "-adapter"))
    adapted = [k for k in final if not torch.equal(final[k], parent.get(k, final[k]))]
    assert adapted, "nothing trained"
    for key, value in final.items():
        if head and key.startswith(head):
            continue
        torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-6, msg=key)


def test_lora_in_sft_reward_models_and_dpo(tmp_path):
    from transformers import AutoModelForCausalLM

    check_ok(rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=3", *SMALL))  # full SFT
    sft = stage_dir(tmp_path, RUN, "sft") / "final"
    for algo, head in (("rm", "score"), ("prm", "score"), ("dpo", None)):
        check_ok(rl_cli(tmp_path, "train", f"algo={algo}", f"run.name={RUN}", "train.max_steps=2", *SMALL, *LORA))
        final = stage_dir(tmp_path, RUN, algo) / "final"
        check_only_adapter_trained(final, sft, head)
    check_adapter_folders(tmp_path, sft)
    # a LoRA SFT from the built-in model: final/ loads in plain transformers with the logits of base + adapter
    check_ok(rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "run.dir=runs/lo/sft_lora",
                    "train.max_steps=3", *SMALL, *LORA))
    import peft

    from rlft.models import load_model, load_tokenizer
    from omegaconf import OmegaConf

    lora_dir = tmp_path / "runs" / "lo" / "sft_lora"
    cfg = OmegaConf.load(lora_dir / "config.yaml")
    tok = load_tokenizer(cfg.model, str(lora_dir / "final"))
    base = load_model(cfg.model, "builtin:tiny", tok, seed=cfg.seed)
    with_adapter = peft.PeftModel.from_pretrained(base, str(lora_dir / "final-adapter"))
    plain = AutoModelForCausalLM.from_pretrained(lora_dir / "final")
    ids = torch.randint(3, 40, (2, 11))
    torch.testing.assert_close(plain(input_ids=ids).logits, with_adapter(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    # its adapter names no base (the built-in model is built fresh): as a model.path it is refused in one line
    proc = eval_cli(tmp_path, lora_dir / "final-adapter")
    assert proc.returncode == 2 and "names no base model" in proc.stderr and str(lora_dir / "final") in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def eval_cli(tmp_path, model_path):
    env = {**rl_env(), "RLFT_CACHE": str(tmp_path / "cache")}
    return run_cli(tmp_path, "eval", f"run.name={RUN}", f"model.path={model_path}", "eval.num_problems=2",
                   "eval.samples=2", "eval.k=[1,2]", *TINY, env=env)


def check_adapter_folders(tmp_path, sft):
    """DPO's adapter folder is peft's (its config names the SFT model as the base), merge_and_unload of base +
    adapter is final/ exactly, and the folder as a model.path is read merged (once, into the model cache)."""
    import peft
    from transformers import AutoModelForCausalLM

    dpo = stage_dir(tmp_path, RUN, "dpo")
    adapter_dir = dpo / "final-adapter"
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(sft.resolve()) and config["task_type"] == "CAUSAL_LM"
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    merged = peft.PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().state_dict()
    final = load_safetensors(dpo / "final")
    assert set(final) <= set(merged)
    assert all(torch.equal(final[k], merged[k]) for k in final)
    check_ok(eval_cli(tmp_path, adapter_dir))
    [folder] = (tmp_path / "cache" / "models").iterdir()
    cached = load_safetensors(folder)
    assert set(cached) == set(final) and all(torch.equal(final[k], cached[k]) for k in final)
    # a reward model's adapter does not carry its trained head: refused, naming the merged model
    rm_adapter = stage_dir(tmp_path, RUN, "rm") / "final-adapter"
    proc = eval_cli(tmp_path, rm_adapter)
    assert proc.returncode == 2 and "use the merged model beside it" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_lora_rl_uses_the_base_model_as_reference(tmp_path):
    make_parents(tmp_path, RUN, ("sft", "rm"))
    sft = stage_dir(tmp_path, RUN, "sft") / "final"
    proc = check_ok(rl_cli(tmp_path, "train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, "train.max_steps=2",
                           "train.lr=1e-2", f"reward.functions=[{USER_REWARD}:alternate]", *LORA))
    assert "reference: the policy's base weights with its LoRA adapter off" in proc.stdout + proc.stderr
    records = [r for r in read_metrics(stage_dir(tmp_path, RUN, "grpo")) if "kl" in r]
    assert records[0]["kl"] < 1e-12 < records[1]["kl"]  # the adapter starts at zero (B = 0), then moves
    check_only_adapter_trained(stage_dir(tmp_path, RUN, "grpo") / "final", sft)
    # PPO: the critic (from the RM) trains its own adapter and head
    check_ok(rl_cli(tmp_path, "train", "algo=ppo", f"run.name={RUN}", *RL_SMALL, "train.max_steps=4",
                    "rollout.samples_per_prompt=1", "train.micro_batch_per_device=2",
                    f"reward.functions=[{USER_REWARD}:alternate]", *LORA))
    ppo = stage_dir(tmp_path, RUN, "ppo")
    check_only_adapter_trained(ppo / "final", sft)
    check_only_adapter_trained(ppo / "critic", stage_dir(tmp_path, RUN, "rm") / "final", "score")


def test_lora_under_zero3_on_two_ranks_matches_one_rank(tmp_path):
    args = ["train", "algo=sft", f"run.name={RUN}", "train.max_steps=2", *SMALL, *LORA,
            "train.micro_batch_per_device=4"]
    check_ok(rl_cli(tmp_path, *args, "run.dir=runs/lo/one"))
    check_ok(rl_cli(tmp_path, *args, "run.dir=runs/lo/two", "deepspeed=zero3", "deepspeed.nproc_per_node=2",
                    timeout=600))
    one, two = (load_safetensors(tmp_path / "runs" / "lo" / d / "final") for d in ("one", "two"))
    assert set(one) == set(two)
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)
    assert (tmp_path / "runs" / "lo" / "two" / "final-adapter" / "adapter_model.safetensors").is_file()


def test_lora_resume_ends_with_the_uninterrupted_weights(tmp_path):
    args = ["train", "algo=sft", f"run.name={RUN}", *SMALL, *LORA, "train.save_every=2", "train.lr_schedule=constant",
            "train.warmup_steps=0"]
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=4", "run.dir=runs/lo/full"))
    # 3 steps (a checkpoint at step 2), then resumed from that checkpoint to 4: as if it had stopped after step 2
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=3", "run.dir=runs/lo/parts"))
    # the checkpoint holds the adapter only: the frozen base is read again from model.path on resume
    [states] = (tmp_path / "runs" / "lo" / "parts").glob("checkpoints/step-0000002/state/*model_states.pt")
    saved = torch.load(states, map_location="cpu", weights_only=False)["module"]
    assert any("lora_" in key for key in saved)
    # no base weight but the tiny model's tied output embedding (state_dict names it twice, DeepSpeed drops one)
    assert [key for key in saved if "lora_" not in key] in ([], ["lm_head.weight"]), sorted(saved)[:5]
    out = check_ok(rl_cli(tmp_path, *args, "train.max_steps=4", "run.dir=runs/lo/parts", "resume=true")).stdout
    assert "resumed from" in out and "step-0000002" in out, out[-2000:]
    full, parts = (load_safetensors(tmp_path / "runs" / "lo" / d / "final") for d in ("full", "parts"))
    for key in full:
        assert torch.equal(full[key], parts[key]), key
    full_a, parts_a = (load_adapter(tmp_path / "runs" / "lo" / d / "final-adapter") for d in ("full", "parts"))
    assert full_a.keys() == parts_a.keys() and all(torch.equal(full_a[k], parts_a[k]) for k in full_a)
