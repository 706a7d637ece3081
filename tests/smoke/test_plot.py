"""`rlft plot`: PNG curves per stage and across stages from metrics.jsonl files."""
from __future__ import annotations

import json

import pytest

from helpers import one_line_error, run_cli
from rlft.plot import PlotError, find_stages, plot_run, read_series, stage_panels


def write_metrics(directory, records):
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "runs" / "demo"
    write_metrics(root / "sft", [{"step": s, "loss": 3.0 / s, "token_acc": 0.1 * s} for s in range(1, 6)])
    for algo, slope in (("grpo", 0.02), ("ppo", 0.01)):
        write_metrics(root / algo, [{"step": 0, "eval_greedy_accuracy": 0.2}]
                      + [{"step": s, "reward": 0.1 + slope * s, "reward/correctness": 0.1 + slope * s, "kl": 0.001 * s,
                          "response_len": 20 - s, "note": "text is skipped"} for s in range(10, 60, 10)])
    (root / "grpo" / "checkpoints" / "step-10").mkdir(parents=True)
    (root / "grpo" / "checkpoints" / "step-10" / "metrics.jsonl").write_text("")
    return root


def test_series_keep_numbers_by_step(run):
    series = read_series(run / "grpo" / "metrics.jsonl")
    assert series["eval_greedy_accuracy"] == [(0, 0.2)]
    assert [s for s, _ in series["reward"]] == [10, 20, 30, 40, 50]
    assert "note" not in series
    assert set(find_stages(run)) == {"sft", "grpo", "ppo"}  # checkpoints/ are not stages


def test_plot_writes_a_png_per_stage_and_comparisons(run):
    import matplotlib.image as mpimg

    paths = plot_run(run)
    names = sorted(p.name for p in paths)
    assert names == ["compare_eval_greedy_accuracy.png", "compare_kl.png", "compare_response_len.png",
                     "compare_reward.png", "grpo.png", "ppo.png", "sft.png"]
    for p in paths:
        assert p.parent == run / "plots"
        image = mpimg.imread(p)  # a real image that opens
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    wide, narrow = mpimg.imread(run / "plots" / "grpo.png"), mpimg.imread(run / "plots" / "sft.png")
    assert wide.shape[1] > narrow.shape[1]  # four panels (reward, KL, accuracy, length) against two


def test_plot_cli_and_its_errors(run, tmp_path):
    proc = run_cli(tmp_path, "plot", str(run / "grpo"), "--out", str(tmp_path / "figs"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "figs" / "grpo.png").is_file() and "wrote" in proc.stdout
    assert "not a directory" in one_line_error(run_cli(tmp_path, "plot", str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    assert "no metrics.jsonl" in one_line_error(run_cli(tmp_path, "plot", str(tmp_path / "empty")))
    with pytest.raises(PlotError):
        plot_run(tmp_path / "empty")


def test_every_logged_accuracy_gets_the_accuracy_panel(tmp_path):
    """The names the stages log: RM pair_acc, PRM step_acc / solution_acc, DPO reward_acc, SFT token_acc."""
    rm = {"loss": [(1, 0.7)], "pair_acc": [(1, 0.6)], "eval_pair_acc": [(1, 0.55)]}
    prm = {"loss": [(1, 0.7)], "step_acc": [(1, 0.6)], "solution_acc": [(1, 0.5)], "eval_step_acc": [(1, 0.5)]}
    dpo = {"loss": [(1, 0.7)], "reward_acc": [(1, 0.6)]}
    for series, expected in ((rm, ["eval_pair_acc", "pair_acc"]), (prm, ["eval_step_acc", "solution_acc", "step_acc"]),
                             (dpo, ["reward_acc"])):
        assert dict(stage_panels(series))["accuracy"] == expected
