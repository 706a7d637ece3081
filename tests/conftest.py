"""Test tiers follow the folders: tests/unit (pure functions, seconds), tests/smoke (a few `rlft` processes
each), tests/integration (several ranks, faults, resumes, whole pipelines). Each test is marked with its
folder's tier (`pytest -m unit`, `-m "not integration"`); shared helpers are in tests/helpers.py."""
from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "smoke", "integration")


def pytest_collection_modifyitems(items):
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
