"""Reward models trained on the policy's own samples (algo.source=policy): PRM steps labelled exactly
(built-in task) or by Monte-Carlo continuations (any question/answer data), with the agreement of the
two reported; an RM that finds no (correct, incorrect) pair says so in one line."""
from __future__ import annotations

import json
import shutil

from helpers import REPO, TINY, TINY_MODEL, check_ok, one_line_error, read_manifest, run_cli, stage_dir

POLICY = ["algo.source=policy", "algo.num_prompts=6", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=16",
          "train.max_steps=2", "train.batch_size=4", "train.micro_batch_per_device=4", "train.log_every=1"]


def sft(tmp_path, *extra):
    check_ok(run_cli(tmp_path, "train", "algo=sft", "run.name=p", *extra, "train.max_steps=3", "train.batch_size=8",
                     "train.micro_batch_per_device=8", timeout=300))


def test_prm_on_policy_samples_with_exact_and_mc_labels(tmp_path):
    sft(tmp_path, *TINY)
    check_ok(run_cli(tmp_path, "train", "algo=prm", "run.name=p", *TINY, *POLICY, "algo.num_eval_rows=3", timeout=300))
    summary = read_manifest(stage_dir(tmp_path, "p", "prm"))["summary"]
    assert summary["train_samples"] == 12 and summary["test_samples"] == 6
    assert 0.0 <= summary["train_step_label_mean"] <= 1.0 and "eval_step_acc" in summary
    # the labelled training solutions are kept for iterative RL's replay, one text row per solution
    rows = [json.loads(line) for line in (stage_dir(tmp_path, "p", "prm") / "train_data.jsonl").read_text().splitlines()]
    assert rows and len(rows) <= 12
    assert all(r["prompt_text"].startswith("Q:") and len(r["steps"]) == len(r["labels"]) for r in rows)
    check_ok(run_cli(tmp_path, "train", "algo=prm", "run.name=p", "run.dir=runs/p/prm_mc", *TINY, *POLICY,
                     "algo.labels=mc", "algo.mc_completions=2", "algo.num_eval_rows=3", timeout=300))
    summary = read_manifest(tmp_path / "runs" / "p" / "prm_mc")["summary"]
    assert 0.0 <= summary["train_mc_exact_agreement"] <= 1.0 and 0.0 <= summary["test_mc_exact_agreement"] <= 1.0


def test_mc_labels_on_local_question_answer_rows(tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    shutil.copy(REPO / "tests" / "data" / "gsm8k_sample.jsonl", data)
    args = ["data=jsonl", f"data.source={data}", "model.path=builtin:tiny", *TINY_MODEL]
    sft(tmp_path, *args)
    proc = run_cli(tmp_path, "train", "algo=prm", "run.name=p", *args, "model.path=stage:sft", *POLICY,
                   "algo.labels=mc", "algo.mc_completions=2", "data.held_out_fraction=0.25", timeout=300)
    check_ok(proc)
    summary = read_manifest(stage_dir(tmp_path, "p", "prm"))["summary"]
    assert summary["train_samples"] == 6 and "train_mc_exact_agreement" not in summary  # no worked steps to check
    # exact labels need the built-in task's worked solutions
    line = one_line_error(run_cli(tmp_path, "train", "algo=prm", "run.name=p", *args, "model.path=stage:sft", *POLICY,
                                  "overwrite=true", timeout=120))
    assert "algo.labels=exact" in line and "algo.labels=mc" in line, line


def test_an_rm_without_correct_samples_says_what_to_change(tmp_path):
    sft(tmp_path, *TINY)  # 3 steps: the policy never answers correctly
    line = one_line_error(run_cli(tmp_path, "train", "algo=rm", "run.name=p", *TINY, *POLICY,
                                  "algo.num_eval_pairs=3", timeout=300))
    assert "no training examples" in line and "rollout.samples_per_prompt" in line, line
    # offline DPO on the policy's own samples needs the same pairs
    line = one_line_error(run_cli(tmp_path, "train", "algo=dpo", "run.name=p", *TINY, *POLICY,
                                  "algo.num_eval_pairs=3", timeout=300))
    assert "dpo: no training pairs (from policy)" in line and "rollout.samples_per_prompt" in line, line
