"""Bad input found before a run starts: each case is the real `rlft` command in a fresh folder, one
`rlft: error:` line naming the problem and the fix, exit code 2, and nothing written anywhere (the run
folder included)."""
from __future__ import annotations

import pytest

from helpers import TINY, run_cli

CASES = [  # (overrides, what the one line says)
    (["run.name=../../x"], "run.name='../../x' is not a run name"),
    (["run.name=/tmp/abs"], "run.name='/tmp/abs' is not a run name"),
    (["run.name="], "run.name=empty is not a run name"),
    (["run.name=a/b"], "not a path; to write elsewhere set run.root=<folder>"),
    (["hydra.run.dir=elsewhere"], "hydra.run.dir is not used by rlft: a stage writes under run.root/run.name/<algo>"),
    (["train.lr=-0.001"], "train.lr=-0.001 must be >= 0.0"),
    (["algo=grpo", "rollout.temperature=0"], "rollout.temperature=0.0 must be > 0.0"),
    (["algo=grpo", "rollout.top_p=1.5"], "rollout.top_p=1.5 must be > 0.0 and <= 1.0"),
    (["algo=grpo", "rollout.max_new_tokens=0"], "rollout.max_new_tokens=0 must be >= 1"),
    (["algo=grpo", "algo.clip_eps_low=0"], "algo.clip_eps_low=0.0 must be > 0.0"),
    (["eval.temperature=-1"], "eval.temperature=-1.0 must be > 0.0"),
    (["algo=grpo", "train.batch_size=32"], "train.batch_size=32 is not read by RL: an optimizer step trains on its "
                                           "share of the rollout"),
    (["algo=sft", "train.max_seq_len=16"], "no SFT example fits train.max_seq_len=16: every training prompt alone"),
]


@pytest.mark.parametrize("overrides, expected", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_mistake_is_one_line_and_writes_nothing(tmp_path, overrides, expected):
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli(work, "train", *TINY, *overrides, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("rlft: error: ") and expected in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"] and not any(work.iterdir())
