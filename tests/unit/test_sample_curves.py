"""scripts/sample_curves.py: accuracy against samples from the RL runs' metrics.jsonl, and samples to a target."""
from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import REPO

spec = importlib.util.spec_from_file_location("sample_curves", REPO / "scripts" / "sample_curves.py")
curves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(curves)


def test_a_runs_evaluations_come_with_the_samples_drawn_so_far(tmp_path):
    lines = [{"step": 0, "eval_greedy_accuracy": 0.5}, {"step": 5, "samples_seen": 1280, "reward": 0.4},
             {"step": 10, "samples_seen": 2560, "eval_greedy_accuracy": 0.55}, {"step": 12, "samples_seen": 3072,
                                                                               "eval_greedy_accuracy": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert curves.curve(tmp_path / "metrics.jsonl") == [(0, 0.5), (2560, 0.55), (3072, 0.6)]


def test_an_evaluation_off_a_logging_step_gets_the_samples_drawn_by_its_step(tmp_path):
    """Evaluations at every 5 steps, logging every 10: step 5 lies between the logged steps 0 and 10, step 15
    past the last one (at its rate)."""
    lines = [{"step": 0, "eval_greedy_accuracy": 0.5}, {"step": 5, "eval_greedy_accuracy": 0.52},
             {"step": 10, "samples_seen": 2560, "eval_greedy_accuracy": 0.55}, {"step": 15, "eval_greedy_accuracy": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert curves.curve(tmp_path / "metrics.jsonl") == [(0, 0.5), (1280, 0.52), (2560, 0.55), (3840, 0.6)]


def test_seeds_average_and_the_samples_to_reach_a_target():
    points = curves.mean_curve([[(0, 0.5), (100, 0.6), (200, 0.7)], [(0, 0.5), (100, 0.62), (200, 0.66)]])
    assert [p[0] for p in points] == [0, 100, 200]
    assert points[1][1] == pytest.approx(0.61) and points[1][2] == pytest.approx(0.0141421, rel=1e-4)
    assert curves.samples_to_reach(points, 0.61) == 100 and curves.samples_to_reach(points, 0.69) is None
