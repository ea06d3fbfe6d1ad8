"""Beyond scalar series: per-parameter lines, the gradient histogram heat map, the threshold."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
from cockpit_web import Feed, LogFollower
from cockpit_web.arrays import HistogramTrack
from cockpit_web.extra_panels import TOTALS_NOTE, common_grid

from cockpit_core.log import dumps, read_run
from cockpit_core.testing import run_cockpit, tiny_mlp

STEPS = 6
INSTRUMENTS = [
    "loss",
    "grad_norm",
    "distance",
    "update_size",
    "hess_trace",
    "grad_hist_1d",
    "hess_max_ev",
    "optimizer_hparams",
]


def _log(folder, quantities, optimizer="sgd"):
    log = folder / "log.jsonl"
    result = run_cockpit(tiny_mlp(), quantities, steps=STEPS, optimizer=optimizer, log=log)
    result.cockpit.close()
    return log


@pytest.fixture(scope="module")
def momentum_log(tmp_path_factory):
    """SGD with lr 0.05, momentum 0.9 and weight decay 1e-3."""
    return _log(tmp_path_factory.mktemp("momentum"), INSTRUMENTS, "sgd_momentum")


@pytest.fixture(scope="module")
def sgd_log(tmp_path_factory):
    """Plain SGD with lr 0.1."""
    return _log(tmp_path_factory.mktemp("sgd"), ["loss", "hess_max_ev", "optimizer_hparams"])


def _panels(payload):
    return {p["id"]: p for p in payload["panels"]}


def test_per_parameter_lines_are_the_logged_values(momentum_log):
    run = read_run(momentum_log)
    names = [p["name"] for p in run.header["params"]]
    panels = _panels(Feed([momentum_log]).payload())
    for key, base in [
        ("grad_norm", "grad_norm"),
        ("distance", "distance"),
        ("update_size", "distance"),
        ("hess_trace", "hess_trace"),
    ]:
        panel = panels[f"{key}-per_param"]
        assert panel["topic"] == panels[base]["topic"] and panel["quantities"] == [key]
        traces = panel["figure"]["data"]
        assert [t["name"] for t in traces] == names  # the header's parameter names
        steps = sorted(s for s in run.output if key in run.output[s])
        for j, trace in enumerate(traces):
            assert list(trace["x"]) == steps
            assert list(trace["y"]) == [float(run.output[s][key]["per_param"][j]) for s in steps]
        assert panel["points"] == len(steps) * len(names)
    ids = [p["id"] for p in Feed([momentum_log]).payload()["panels"]]
    assert ids.index("grad_norm-per_param") == ids.index("grad_norm") + 1  # right below it
    for panel in panels.values():  # every figure is valid for plotly
        go.Figure(panel["figure"])


def test_histogram_heat_map_is_log_counts_at_evenly_chosen_steps(momentum_log):
    run = read_run(momentum_log)
    panels = _panels(Feed([momentum_log], heatmap_columns=4).payload())
    panel = panels["grad_hist_time"]
    assert panel["topic"] == "gradient" and panel["quantities"] == ["grad_hist_1d"]
    (heat,) = panel["figure"]["data"]
    assert heat["type"] == "heatmap"
    steps = list(heat["x"])
    assert len(steps) == 4 and steps[0] == 0 and steps[-1] == STEPS - 1  # the size bound
    edges = np.asarray(run.output[0]["grad_hist_1d"]["edges"], dtype=float)
    assert list(heat["y"]) == edges.tolist()  # a fixed range: the logged edges
    counts = np.stack([np.asarray(run.output[s]["grad_hist_1d"]["hist"]) for s in steps], 1)
    assert np.asarray(heat["z"]).shape == (edges.size - 1, 4)
    assert np.asarray(heat["z"]).tolist() == np.round(np.log10(1 + counts), 3).tolist()
    assert counts.sum() > 0 and panel["points"] == STEPS
    assert panel["figure"]["layout"]["yaxis"]["title"]["text"] == "gradient element value"
    go.Figure(panel["figure"])
    every = _panels(Feed([momentum_log]).payload())["grad_hist_time"]["figure"]["data"][0]
    assert list(every["x"]) == list(range(STEPS))  # under the bound: every step


def test_histograms_kept_while_following_stay_bounded_and_evenly_spaced():
    track = HistogramTrack(columns=10)
    edges = np.linspace(-1.0, 1.0, 4)
    for step in range(1000):
        track.add(step, (np.full(3, float(step)), edges))
        assert len(track.kept) <= 20
    shown = track.histograms()
    steps = [s for s, _, _ in shown]
    assert len(steps) == 10 and steps[0] == 0 and steps[-1] == 999
    assert [c[0] for _, c, _ in shown] == [float(s) for s in steps]  # each step's own counts
    assert track.stride == 64 and all(s % 64 == 0 for s in steps[:-1])  # evenly kept
    assert len(track.kept) == len(range(0, 1000, 64))


def test_histograms_with_moving_edges_are_rebinned_keeping_their_totals():
    same = [(0, np.array([1.0, 2.0]), np.array([0.0, 1.0, 2.0]))] * 2
    counts, grid = common_grid(same)
    assert counts.tolist() == [[1.0, 1.0], [2.0, 2.0]] and grid.tolist() == [0.0, 1.0, 2.0]
    moved = [same[0], (1, np.array([4.0, 4.0]), np.array([0.0, 2.0, 4.0]))]
    counts, grid = common_grid(moved)
    assert grid.tolist() == [0.0, 2.0, 4.0]
    assert counts[:, 0].tolist() == [3.0, 0.0] and counts[:, 1].tolist() == [4.0, 4.0]


def test_sharpness_panel_draws_the_momentum_threshold(momentum_log):
    run = read_run(momentum_log)
    panel = _panels(Feed([momentum_log]).payload())["hess_max_ev"]
    sharpness, line = panel["figure"]["data"]
    assert sharpness["name"] == "hess_max_ev/value"
    group = run.output[0]["optimizer_hparams"]["groups"][0]
    lr, beta, wd = group["lr"], group["momentum"], group["weight_decay"]
    assert (lr, beta, wd) == (0.05, 0.9, 0.001)
    expected = (2 + 2 * beta) / lr - wd
    assert line["name"] == f"stability threshold 2(1 + momentum)/lr - weight_decay = {expected:.3g}"
    assert list(line["x"]) == sorted(run.output)
    assert line["y"] == pytest.approx([expected] * STEPS, rel=1e-12)
    assert line["line"]["dash"] == "dash" and line["line"]["shape"] == "hv"
    assert panel["figure"]["layout"]["yaxis"]["type"] == "log"  # 76 vs a sharpness below 1


def test_sharpness_panel_draws_two_over_lr_for_plain_sgd(sgd_log):
    run = read_run(sgd_log)
    lr = run.output[0]["optimizer_hparams"]["groups"][0]["lr"]
    panel = _panels(Feed([sgd_log]).payload())["hess_max_ev"]
    _, line = panel["figure"]["data"]
    assert line["name"] == f"stability threshold 2/lr = {2 / lr:.3g}"
    assert list(line["y"]) == [2 / lr] * STEPS
    assert panel["points"] == 2 * STEPS


def test_no_threshold_for_adam_and_no_extra_panels_without_their_quantities(tmp_path):
    adam = _log(tmp_path / "adam", ["loss", "hess_max_ev", "optimizer_hparams"], "adam")
    panels = _panels(Feed([adam]).payload())
    assert [t["name"] for t in panels["hess_max_ev"]["figure"]["data"]] == ["hess_max_ev/value"]
    plain = _log(tmp_path / "plain", ["loss", "hess_max_ev", "time"])
    panels = _panels(Feed([plain]).payload())
    assert sorted(panels) == ["hess_max_ev", "loss", "time"]
    assert len(panels["hess_max_ev"]["figure"]["data"]) == 1
    assert panels["hess_max_ev"]["figure"]["layout"]["yaxis"]["type"] == "linear"


def test_several_runs_overlay_totals_and_get_a_heat_map_each(momentum_log, sgd_log):
    payload = Feed([momentum_log, sgd_log], labels=["mom", "sgd"]).payload()
    panels = _panels(payload)
    assert not [i for i in panels if i.endswith("-per_param")]
    assert panels["grad_norm"]["title"] == "Gradient norm" + TOTALS_NOTE
    assert panels["distance"]["title"].endswith(TOTALS_NOTE)
    assert [i for i in panels if i.startswith("grad_hist_time")] == ["grad_hist_time-0"]
    assert panels["grad_hist_time-0"]["title"] == "Gradient histogram over time [mom]"
    names = [t["name"] for t in panels["hess_max_ev"]["figure"]["data"]]
    assert names[2:] == [
        "mom: stability threshold 2(1 + momentum)/lr - weight_decay = 76",
        "sgd: stability threshold 2/lr = 20",
    ]


def test_follower_updates_the_heat_map_and_lines_on_append(momentum_log, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_bytes(momentum_log.read_bytes())
    follower = LogFollower(log, "run")
    follower.poll()
    last = read_run(momentum_log).output[STEPS - 1]
    with open(log, "a") as f:
        f.write(dumps({"kind": "values", "step": 40, "values": last}) + "\n")
    assert follower.poll()
    assert follower.arrays.per_param["grad_norm"].items()[-1] == (
        40,
        [float(v) for v in last["grad_norm"]["per_param"]],
    )
    assert follower.arrays.histograms["grad_hist_1d"].histograms()[-1][0] == 40
    assert max(follower.arrays.thresholds) == 40


def test_per_parameter_values_are_kept_only_for_a_bounded_number_of_parameters():
    from cockpit_web.arrays import PER_PARAM_MAX, ArrayStore

    wide = ArrayStore()
    wide.header({"params": [{"name": f"p{i}"} for i in range(PER_PARAM_MAX + 1)]})
    wide.values(0, {"grad_norm": {"total": 1.0, "per_param": [0.1] * (PER_PARAM_MAX + 1)}}, {})
    assert wide.per_param == {}
    narrow = ArrayStore()
    narrow.header({"params": [{"name": "w"}, {"name": "b"}]})
    narrow.values(0, {"grad_norm": {"total": 1.0, "per_param": [0.5, float("nan"), 1.0]}}, {})
    assert narrow.per_param == {}  # not one value per parameter
    narrow.values(0, {"grad_norm": {"total": 1.0, "per_param": [0.5, float("inf")]}}, {})
    assert narrow.per_param["grad_norm"].items() == [(0, [0.5, None])]  # non-finite: a gap


def test_a_long_runs_heat_map_stays_small():
    import json
    from types import SimpleNamespace

    from cockpit_web.arrays import HEATMAP_COLUMNS, ArrayStore
    from cockpit_web.panels import figures

    arrays, edges = ArrayStore(), np.linspace(-2.0, 2.0, 101)
    counts = np.random.default_rng(0).integers(0, 10**6, (5000, 100))
    for step in range(5000):
        arrays.values(step, {"grad_hist_1d": {"hist": counts[step], "edges": edges}}, {})
    assert len(arrays.histograms["grad_hist_1d"].kept) <= 2 * HEATMAP_COLUMNS
    run = SimpleNamespace(label="r", series={}, names={}, arrays=arrays)
    (panel,) = figures([run])
    (heat,) = panel["figure"]["data"]
    assert len(heat["x"]) == HEATMAP_COLUMNS == 200 and heat["x"][-1] == 4999
    column = heat["x"].index(4999)
    assert [row[column] for row in heat["z"]] == np.round(np.log10(1 + counts[4999]), 3).tolist()
    assert len(json.dumps(panel["figure"]["data"])) < 150_000  # the bound docs/dashboard.md states
