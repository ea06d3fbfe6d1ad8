"""The follower's bounded, incremental fold (issue 29, point 5)."""

from __future__ import annotations

import json

from cockpit_web import Feed
from cockpit_web.follow import LogFollower
from cockpit_web.reduce import ReducedSeries

from cockpit_core.diagnosing.run import diagnose
from cockpit_core.log import read_run


def _write(path, records, mode="a"):
    with open(path, mode) as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_a_long_series_is_reduced_to_at_most_limit_points_keeping_its_extremes():
    series = ReducedSeries(200)
    values = {s: float((s * 7919) % 1000) for s in range(100_000)}
    values[31_337] = -5.0
    values[77_777] = 5000.0
    for step, value in values.items():
        series.set(step, value)
    shown = series.points()
    assert len(shown) <= 200 and series.count == len(values)
    assert shown[31_337] == -5.0 and shown[77_777] == 5000.0
    assert min(v for v in shown.values() if v is not None) == -5.0
    assert set(shown.items()) <= set(values.items())  # every point shown is a real one
    assert max(shown) == 99_999  # the latest value is kept exactly


def test_the_follower_keeps_bounded_series_of_a_long_log(tmp_path):
    path = tmp_path / "log.jsonl"
    records = [{"kind": "header", "quantities": [{"name": "loss", "key": "loss"}]}]
    records += [
        {"kind": "values", "step": s, "values": {"loss": 1.0 / (1 + s)}} for s in range(20_000)
    ]
    _write(path, records)
    follower = LogFollower(path, "run", points=500)
    follower.poll()
    assert len(follower.series["loss"]) <= 500
    assert follower.series["loss"][0] == 1.0  # the largest value survives
    assert len(follower.data.output) <= 512  # rows of the latest steps only


def test_a_change_folds_only_the_new_records(tmp_path):
    path = tmp_path / "log.jsonl"
    records = [{"kind": "header", "quantities": [{"name": "loss", "key": "loss"}]}]
    records += [{"kind": "values", "step": s, "values": {"loss": float(s)}} for s in range(3000)]
    _write(path, records)
    follower = LogFollower(path, "run")
    follower.poll()
    before = follower.applied
    _write(path, [{"kind": "values", "step": 3000, "values": {"loss": 1.0}}])
    follower.poll()
    assert follower.applied - before == 1 and follower.refolds == 0


def _resumed_log():
    header = {
        "kind": "header",
        "quantities": [
            {"name": "grad_norm", "key": "grad_norm"},
            {"name": "grad_hist_1d", "key": "grad_hist_1d"},
        ],
        "params": [{"name": "w"}, {"name": "b"}],
    }

    def values(step, total, per_param=None, hist=None):
        found = {"grad_norm": {"total": total}}
        if per_param is not None:
            found["grad_norm"]["per_param"] = per_param
        if hist is not None:
            found["grad_hist_1d"] = {"hist": hist, "edges": [0.0, 1.0, 2.0]}
        return {"kind": "values", "step": step, "values": found}

    run1 = [header] + [values(s, s, [s, -s], [s, 1]) for s in range(10)]
    # run 2 resumes from step 5's checkpoint and records step 6 without the arrays
    run2 = [header, {"kind": "resumed", "step": 5, "from_run": 1}]
    run2 += [values(6, 106), values(7, 107, [107, 0], [7, 7])]
    return run1, run2


def test_per_param_and_histogram_views_after_a_resume_equal_read_run(tmp_path):
    path = tmp_path / "log.jsonl"
    run1, run2 = _resumed_log()
    _write(path, run1)
    follower = LogFollower(path, "run")
    follower.poll()
    applied = follower.applied
    _write(path, run2)
    follower.poll()
    assert follower.refolds == 0 and follower.applied - applied == len(run2)  # incremental
    data = read_run(path)
    per_param = [
        (s, [float(v) for v in row["grad_norm"]["per_param"]])
        for s, row in data.output.items()
        if "per_param" in row["grad_norm"]
    ]
    assert 6 not in dict(per_param)  # run 2 recorded step 6 without them
    assert follower.arrays.per_param["grad_norm"].items() == per_param
    hists = [
        (s, row["grad_hist_1d"]["hist"]) for s, row in data.output.items() if "grad_hist_1d" in row
    ]
    shown = follower.arrays.histograms["grad_hist_1d"].histograms()
    assert [(s, c.tolist()) for s, c, _ in shown] == [(s, [float(v) for v in h]) for s, h in hists]
    assert follower.series["grad_norm/total"] == {
        s: float(row["grad_norm"]["total"]) for s, row in data.output.items()
    }


def test_a_resume_past_the_kept_rows_folds_the_log_again_as_read_run(tmp_path):
    path = tmp_path / "log.jsonl"
    header = {"kind": "header", "quantities": [{"name": "loss", "key": "loss"}]}
    _write(
        path,
        [header] + [{"kind": "values", "step": s, "values": {"loss": 1.0}} for s in range(2000)],
    )
    follower = LogFollower(path, "run", points=100_000)
    follower.poll()
    _write(path, [header, {"kind": "resumed", "step": 99, "from_run": 1}])
    _write(path, [{"kind": "values", "step": s, "values": {"loss": 2.0}} for s in range(100, 150)])
    follower.poll()
    assert follower.refolds == 1
    data = read_run(path)
    assert follower.series["loss"] == {s: row["loss"] for s, row in data.output.items()}


def _troubled(step):
    loss = float("nan") if step == 50 else 1.0 + 0.05 * step
    return {
        "kind": "values",
        "step": step,
        "values": {"loss": loss, "grad_norm": {"total": 1.1**step}},
    }


def test_incremental_diagnoses_find_what_cockpit_diagnose_finds(tmp_path):
    path = tmp_path / "log.jsonl"
    header = {
        "kind": "header",
        "quantities": [{"name": "loss", "key": "loss"}, {"name": "grad_norm", "key": "grad_norm"}],
    }
    _write(path, [header])
    feed = Feed([path])
    follower = feed.runs[0]
    for start in range(0, 60, 7):  # the log grows; the page is asked for after each piece
        _write(path, [_troubled(s) for s in range(start, min(start + 7, 60))])
        feed.poll()
        feed._diagnosed.clear()  # due at once (not DIAGNOSE_SHARE later)
        found = feed.payload()["findings"]
    expected = diagnose(path)
    assert expected  # the log has something to find
    assert sorted(f["id"] for f in found) == sorted(f.id for f in expected)
    assert follower.refolds == 0
    assert follower.keeper is not None and follower.keeper.observed == 61  # each record once


def test_the_diagnoses_window_drops_the_steps_the_runner_drops():
    import random

    from cockpit_web.follow import _Keeper

    from cockpit_core.diagnosing.build import build_diagnoses
    from cockpit_core.diagnosing.runner import DiagnosisRunner

    keeper = _Keeper(7)
    plain = DiagnosisRunner(build_diagnoses(None, None, None), max_steps=7, every_step=True)
    rng = random.Random(0)
    for i in range(300):
        step = i + rng.randint(-12, 3)  # mostly growing, sometimes late or repeated
        record = {"kind": "values", "step": step, "values": {"loss": float(i)}}
        keeper.observe(record)
        plain.observe(record)
        if i % 50 == 0:
            keeper.drop(step)
            plain.output.pop(step, None)
        assert keeper.runner.output == plain.output


def test_a_written_page_diagnoses_every_step(tmp_path, monkeypatch):
    from cockpit_web import write_page

    monkeypatch.setattr("cockpit_web.follow.DIAGNOSE_STEPS", 5)
    path = tmp_path / "log.jsonl"
    header = {"kind": "header", "quantities": [{"name": "loss", "key": "loss"}]}
    _write(path, [header] + [_troubled(s) for s in range(60)])
    feed = Feed([path])
    feed.poll()  # read with the live window (5 steps) first
    assert len(feed.runs[0].keeper.runner.output) == 5
    write_page(feed, tmp_path / "page.html")
    assert len(feed.runs[0].keeper.runner.output) == 60
    assert {f["id"] for f in feed.payload()["findings"]} == {f.id for f in diagnose(path)}
