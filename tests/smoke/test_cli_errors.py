"""User mistakes cost seconds and one line on stderr (exit code != 0); help and listings work.

Each case runs the real `rlft` entry point as a subprocess in tmp_path. The override checks run
before Hydra and before torch is imported, so each finishes in a few seconds.
"""
from __future__ import annotations

import json
from pathlib import Path
import sys
import time

from helpers import TINY, TINY_MODEL, cli_env, explain, one_line_error, run_cli, stage_dir

QUICK_S = 10  # generous: the override checks take ~1 s here, but other jobs share the CPUs


def timed(tmp_path, *args):
    tic = time.time()
    proc = run_cli(tmp_path, *args, timeout=120)
    return proc, time.time() - tic


def test_unknown_algo_names_the_valid_ones(tmp_path):
    proc, seconds = timed(tmp_path, "train", "algo=nope", *TINY)
    line = one_line_error(proc)
    assert "'nope'" in line
    valid = line.split("valid:", 1)[1]
    for algo in ("sft", "rm", "prm"):
        assert algo in valid.replace(",", " ").split(), line
    assert seconds < QUICK_S
    assert not (tmp_path / "runs").exists()


def test_unknown_train_key_lists_train_keys(tmp_path):
    proc, seconds = timed(tmp_path, "train", "train.nope=1", *TINY)
    line = one_line_error(proc)
    assert "train.nope" in line
    for key in ("max_steps", "batch_size", "micro_batch_per_device", "lr", "save_every"):
        assert key in line, line
    assert seconds < QUICK_S


def test_deepspeed_option_typo_suggests_zero3(tmp_path):
    proc, seconds = timed(tmp_path, "train", "deepspeed=zero9", *TINY)
    line = one_line_error(proc)
    assert "did you mean 'zero3'" in line, line
    assert "zero0" in line and "cpu" in line  # the valid options are listed
    assert seconds < QUICK_S


def test_unknown_option_inside_a_sweep_is_caught(tmp_path):
    line = one_line_error(run_cli(tmp_path, "train", "-m", "deepspeed=zero2,zero7", *TINY, timeout=120))
    assert "zero7" in line


def test_invalid_value_is_one_line_from_validation(tmp_path):
    line = one_line_error(run_cli(tmp_path, "train", "train.batch_size=10", "train.micro_batch_per_device=4",
                                  *TINY, timeout=120))
    assert "train.batch_size=10" in line


def test_unknown_command(tmp_path):
    line = one_line_error(run_cli(tmp_path, "fly", timeout=60))
    assert "'fly'" in line and "train" in line


def test_help(tmp_path):
    for args in (["--help"], [], ["train", "--help"]):
        proc = run_cli(tmp_path, *args, timeout=60)
        assert proc.returncode == 0, explain(proc)
        assert "usage: rlft" in proc.stdout
        for word in ("train", "eval", "list", "-m"):
            assert word in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_console_script_help(tmp_path):
    import shutil

    exe = shutil.which("rlft")
    assert exe, "the `rlft` console script is not installed (pip install -e .)"
    proc = run_cli(tmp_path, "--help", prefix=[exe], timeout=60)
    assert proc.returncode == 0 and "usage: rlft" in proc.stdout, explain(proc)


def test_list_groups(tmp_path):
    proc = run_cli(tmp_path, "list", timeout=60)
    assert proc.returncode == 0, explain(proc)
    groups = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line and not line.startswith("`"))
    assert {"sft", "rm", "prm"} <= set(groups["algo"].split(", "))
    assert {"zero0", "zero1", "zero2", "zero3"} <= set(groups["deepspeed"].split(", "))


def test_list_algo_describes_each(tmp_path):
    proc = run_cli(tmp_path, "list", "algo", timeout=60)
    assert proc.returncode == 0, explain(proc)
    described = {line.split()[0]: line.split(None, 1)[1] for line in proc.stdout.splitlines() if line.strip()}
    assert {"sft", "rm", "prm"} <= set(described)
    assert "Bradley-Terry" in described["rm"]


def test_list_keys_train(tmp_path):
    proc = run_cli(tmp_path, "list", "keys", "train", timeout=60)
    assert proc.returncode == 0, explain(proc)
    rows = [line.split(None, 2) for line in proc.stdout.splitlines() if line.strip()]
    keys = {r[0]: r for r in rows}
    assert all(k.startswith("train.") for k in keys)
    assert keys["train.max_steps"][1] == "(table)" and keys["train.max_samples"][1] == "0"
    assert all(len(r) == 3 and r[2].strip() for r in rows), "every key has a default and a doc"


def test_list_keys_of_one_algo(tmp_path):
    proc = run_cli(tmp_path, "list", "keys", "algo.rm", timeout=60)
    assert proc.returncode == 0, explain(proc)
    keys = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert keys and all(k.startswith(("algo.", "algo(rm).")) for k in keys), keys[:5]
    assert any(k.endswith(".num_eval_pairs") for k in keys)


def test_missing_input_checkpoint_names_the_command(tmp_path):
    proc = run_cli(tmp_path, "train", "algo=rm", "run.name=missing", *TINY, timeout=120)
    line = one_line_error(proc)
    assert "rlft train algo=sft run.name=missing" in line, line
    assert not (stage_dir(tmp_path, "missing", "rm") / "final").exists()
    assert not (stage_dir(tmp_path, "missing", "rm") / "manifest.json").exists()


def test_eval_of_missing_stage_names_the_command(tmp_path):
    line = one_line_error(run_cli(tmp_path, "eval", "run.name=nothing", *TINY, timeout=120))
    assert "rlft train algo=sft run.name=nothing" in line, line


def test_jsonl_row_without_answer_names_file_row_and_field(tmp_path):
    data = tmp_path / "bad.jsonl"
    rows = [{"question": "What is 1+1?", "answer": "1+1=2\n#### 2"},
            {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"},
            {"question": "What is 3+3?"}]  # row 3 lacks its answer
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_cli(tmp_path, "train", "algo=sft", "run.name=bad", "data=jsonl", f"data.source={data}",
                   "model.path=builtin:tiny", *TINY_MODEL, "train.max_steps=2", "train.batch_size=2",
                   "train.micro_batch_per_device=2", timeout=120)
    line = one_line_error(proc)
    assert str(data) in line, line
    assert "row 3" in line, line
    assert "answer" in line, line
    run = stage_dir(tmp_path, "bad", "sft")
    assert not (run / "final").exists()
    assert not (run / "manifest.json").exists()
    assert not (run / "checkpoints").exists()


def test_hydra_cfg_flag_passes_through(tmp_path):
    proc = run_cli(tmp_path, "train", "--cfg", "job", "algo=rm", timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert "name: rm" in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_override_checks_do_not_import_torch(tmp_path):
    """cli.py promises that overrides are checked before anything heavy is imported.

    (rlft.config imports rlft.data.synthetic; an eager rlft/data/__init__.py used to pull in torch
    and transformers there, so every mistake and every `rlft list` cost ~2.5 s.)"""
    code = ("import sys; from rlft.overrides import check_overrides; check_overrides(['algo=sft']); "
            "print(sorted(m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules))")
    proc = run_cli(tmp_path, prefix=[sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.strip() == "[]"


def test_rlft_debug_shows_the_traceback_before_the_line(tmp_path):
    """RLFT_DEBUG=1: a user error's traceback is shown, and the one line still ends stderr."""
    proc = run_cli(tmp_path, "train", "algo=nope", *TINY, timeout=120, env=cli_env(RLFT_DEBUG="1"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[0].startswith("Traceback") and "ConfigError" in proc.stderr, proc.stderr
    assert lines[-1].startswith("rlft: error: ") and "'nope'" in lines[-1]
    quiet = run_cli(tmp_path, "train", "algo=nope", *TINY, timeout=120)
    assert len(quiet.stderr.strip().splitlines()) == 1


def test_a_recipe_of_the_users_own_is_an_experiment(tmp_path):
    """`--config-dir <dir>` (or hydra.searchpath=[file://<dir>]) with <dir>/experiment/<name>.yaml: the checks know
    it, Hydra composes it, the header names it as the source; an unknown one says how to add one."""
    from rlft.overrides import user_config_dirs

    recipe = tmp_path / "mine" / "experiment" / "short_grpo.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text("# @package _global_\ndefaults:\n  - override /algo: grpo\ntrain:\n  lr: 5.0e-5\n")
    assert user_config_dirs(["--config-dir", "a", "x=1", "hydra.searchpath=[file://b,pkg://c,file://d]"]) == \
        [Path("a"), Path("b"), Path("d")]
    for flag in (["--config-dir", str(tmp_path / "mine")], [f"hydra.searchpath=[file://{tmp_path / 'mine'}]"]):
        proc = run_cli(tmp_path, "train", "--cfg", "job", *flag, "experiment=short_grpo", timeout=120)
        assert proc.returncode == 0, explain(proc)
        assert "lr: 5.0e-05" in proc.stdout and "samples_per_prompt: 8" in proc.stdout
    line = one_line_error(run_cli(tmp_path, "train", "experiment=short_grpo", timeout=120))
    assert "unknown experiment 'short_grpo'" in line
    assert "--config-dir <folder> holding experiment/short_grpo.yaml" in line
    line = one_line_error(run_cli(tmp_path, "train", "--config-dir", str(tmp_path / "nope"), "algo=sft", timeout=120))
    assert line == (f"rlft: error: config folder not found: {tmp_path / 'nope'} "
                    "(named by --config-dir or hydra.searchpath)")


def test_importing_rlft_silences_the_hub_kernel_lines_of_bitsandbytes():
    import os
    import subprocess

    proc = subprocess.run([sys.executable, "-c", "import rlft, bitsandbytes"], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 0
    assert "publisher trust check" not in proc.stderr and "kernels-community" not in proc.stderr
