"""LogFollower: a log's scalar series, read incrementally, against brute-force values."""

from __future__ import annotations

import json
import math

import pytest
import torch
from cockpit_web import LogFollower

from cockpit_core.log import dumps, read_log

from .conftest import STEPS

# The run is float64 and the log keeps every float's shortest repr (exact round trip);
# what remains is the summation order of the norm: a few ulps.
RTOL = 1e-12


def test_series_match_brute_force_values(logged_run):
    follower = LogFollower(logged_run.log, "run")
    assert follower.poll() is True
    snapshots = logged_run.result.snapshots
    assert sorted(follower.series["loss"]) == list(range(STEPS))
    for snap in snapshots:
        assert follower.series["loss"][snap.step] == pytest.approx(snap.loss, rel=RTOL)
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in snap.grads))
        assert follower.series["grad_norm/total"][snap.step] == pytest.approx(norm, rel=RTOL)
    # distance from where tracking began: ||theta_s - theta_0|| with the parameters of step s
    start = torch.cat([p.flatten() for p in snapshots[0].params])
    for snap in snapshots:
        expected = float((torch.cat([p.flatten() for p in snap.params]) - start).norm())
        assert follower.series["distance/total"][snap.step] == pytest.approx(
            expected, rel=RTOL, abs=1e-15
        )
    assert follower.series["metrics/valid_loss"] == {STEPS - 1: 0.75}
    assert follower.names == {"loss": "loss", "grad_norm": "grad_norm", "distance": "distance"}
    assert follower.last_step == STEPS - 1 and follower.error is None
    assert follower.poll() is False  # nothing new


def test_reads_only_complete_lines_and_continues_where_it_stopped(logged_run, tmp_path):
    lines = logged_run.log.read_bytes().splitlines(keepends=True)
    growing = tmp_path / "growing.jsonl"
    follower = LogFollower(growing, "g")
    assert follower.poll() is False and follower.error is None  # not there yet: waits
    growing.write_bytes(lines[0] + lines[1][:10])  # the header and a torn line
    assert follower.poll() is True and follower.records == 1 and follower.series == {}
    with open(growing, "ab") as f:
        f.write(lines[1][10:])
        f.writelines(lines[2:])
    assert follower.poll() is True and follower.records == len(lines)
    whole = LogFollower(logged_run.log, "w")
    whole.poll()
    assert follower.series == whole.series


def test_a_truncated_or_replaced_log_is_read_from_the_start(logged_run):
    follower = LogFollower(logged_run.log, "run")
    follower.poll()
    lines = logged_run.log.read_bytes().splitlines(keepends=True)
    logged_run.log.write_bytes(b"".join(lines[:2]))  # a new, shorter run in its place
    assert follower.poll() is True
    assert follower.records == 2 and list(follower.series["loss"]) == [0]


def test_consolidated_json_gives_the_same_series(logged_run, tmp_path):
    jsonl = LogFollower(logged_run.log, "a")
    jsonl.poll()
    out = tmp_path / "output.json"
    logged_run.result.cockpit.write(out)
    consolidated = LogFollower(out, "b")
    assert consolidated.poll() is True and consolidated.poll() is False
    assert consolidated.series == jsonl.series
    assert read_log(out)[0]["loss"] == consolidated.series["loss"][0]


def test_later_records_of_a_step_win_and_nonfinite_values_are_gaps(logged_run):
    with open(logged_run.log, "a") as f:
        f.write(dumps({"kind": "values", "step": 1, "values": {"loss": 9.5}}) + "\n")
        f.write(dumps({"kind": "values", "step": 7, "values": {"loss": float("nan")}}) + "\n")
    follower = LogFollower(logged_run.log, "run")
    follower.poll()
    assert follower.series["loss"][1] == 9.5
    assert follower.series["loss"][7] is None and follower.last_step == 7


def test_a_damaged_line_is_skipped_and_reported(logged_run):
    with open(logged_run.log, "a") as f:
        f.write('{"kind": "values", "step": 9, "values": {"x": {"__reduce__": 1}}}\n')
        f.write(json.dumps({"kind": "values", "step": 10, "values": {"loss": 0.5}}) + "\n")
    follower = LogFollower(logged_run.log, "run")
    follower.poll()
    assert "damaged line was skipped" in follower.error
    assert follower.series["loss"][10] == 0.5 and 9 not in follower.series["loss"]
