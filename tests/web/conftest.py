"""Shared fixtures of the web view's tests: a real log of a tiny training run."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from cockpit_core.testing import RunResult, run_cockpit, tiny_mlp

STEPS = 4
QUANTITIES = ["loss", "grad_norm", "distance"]


@dataclass
class LoggedRun:
    log: Path
    result: RunResult


@pytest.fixture(scope="session")
def _logged_run(tmp_path_factory) -> LoggedRun:
    folder = tmp_path_factory.mktemp("run")
    result = run_cockpit(tiny_mlp(), QUANTITIES, steps=STEPS, log=folder / "log.jsonl")
    result.cockpit.log(STEPS - 1, valid_loss=0.75)  # a metric of cp.log
    result.cockpit.close()
    return LoggedRun(folder / "log.jsonl", result)


@pytest.fixture
def logged_run(_logged_run, tmp_path) -> LoggedRun:
    """A copy of a 4-step run's log in ``tmp_path/run/log.jsonl`` (free to append to)."""
    (tmp_path / "run").mkdir()
    log = tmp_path / "run" / "log.jsonl"
    shutil.copy(_logged_run.log, log)
    return LoggedRun(log, _logged_run.result)
