"""rlft/experiments.py: the one runner of rlft commands the experiment scripts share, and its table cell."""
from __future__ import annotations

import pytest

from rlft.experiments import cell, rlft_command


def test_a_command_that_succeeds_is_logged_and_timed(tmp_path, capsys):
    log = tmp_path / "logs" / "list.log"
    finished = rlft_command(["list", "algo"], log, tag="t")
    assert finished.code == 0 and finished.seconds > 0
    text = log.read_text()
    assert text.startswith("rlft list algo\n") and "grpo" in text  # the command line, then its output
    printed = capsys.readouterr().out
    assert "[t] rlft list algo" in printed and "[t] done in" in printed


def test_a_failing_command_stops_the_script_with_its_logs_last_lines(tmp_path):
    log = tmp_path / "bad.log"
    with pytest.raises(SystemExit) as stop:
        rlft_command(["train", "algo=no_such_algo"], log, tag="t")
    assert "exit" in str(stop.value) and "no_such_algo" in str(stop.value) and str(log) in str(stop.value)
    finished = rlft_command(["train", "algo=no_such_algo"], log, tag="t", check=False)
    assert finished.code != 0 and "no_such_algo" in finished.tail


def test_cell_is_mean_and_std_of_the_values_present():
    assert cell([0.5, 0.7]) == "60.0 ± 14.1"
    assert cell([0.25]) == "25.0" and cell([None]) == "–"
    assert cell([1.0, 2.0, None], scale=1, digits=2) == "1.50 ± 0.71"
