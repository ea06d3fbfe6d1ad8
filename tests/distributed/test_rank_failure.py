"""A quantity that fails on one process only: every process records it, training goes on.

Needs cockpit_core/engine/step.py to call ``StepSync.run`` (see docs/distributed.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _failure_worker import FAILING_STEP, STEPS  # noqa: E402
from test_ddp import assert_same, launch  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = {}
    for scenario in ("none", "quantity"):
        d = tmp_path_factory.mktemp(scenario)
        out[scenario] = launch("_failure_worker.py", 2, d, scenario)
    return out


def test_a_quantity_failing_on_rank_1_fails_on_every_rank(runs):
    for rank, result in enumerate(runs["quantity"]):
        assert set(result["output"]) == set(range(STEPS)), f"rank {rank} did not finish"
        failed = {(e["step"], e["quantity"]) for e in result["errors"]}
        assert failed == {(FAILING_STEP, "flaky"), (FAILING_STEP, "flaky_hvp")}, rank
        for e in result["errors"]:
            if rank == 0:
                assert "process(es) [1]" in e["error"]
        assert "flaky" not in result["output"][FAILING_STEP]
        assert "flaky_hvp" not in result["output"][FAILING_STEP]


def test_other_quantities_are_unchanged(runs):
    for rank in range(2):
        ref, out = runs["none"][rank]["output"], runs["quantity"][rank]["output"]
        for step in range(STEPS):
            for key, value in ref[step].items():
                if step == FAILING_STEP and key.startswith("flaky"):
                    continue
                if key == "time":
                    continue
                assert_same(out[step][key], value, 1e-10, f"rank{rank} step{step} {key}")
