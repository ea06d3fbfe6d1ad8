"""The web view's panels come from the instruments' charts: the new quantities, a third party's."""

from __future__ import annotations

import math

import cockpit_basic.plugin
import numpy as np
import plotly.graph_objects as go
import pytest
from cockpit_web import Feed

from cockpit_core import hookimpl
from cockpit_core.log import dumps, read_run
from cockpit_core.panel import Chart, Each, Instrument
from cockpit_core.plugin.registry import Registry
from cockpit_core.testing import run_cockpit, tiny_mlp

STEPS = 4
NEW = ["loss", "activations", "logits", "param_norm", "update_ratio", "noise_scale"]


@pytest.fixture(scope="module")
def new_log(tmp_path_factory):
    """A real 4-step run of the tiny MLP tracking the new quantities."""
    log = tmp_path_factory.mktemp("new") / "log.jsonl"
    result = run_cockpit(tiny_mlp(), NEW, steps=STEPS, log=log)
    result.cockpit.close()
    return log


def _write(path, quantities, values, params=()):
    """A log in the format cockpit writes: a header, then one values record per step."""
    header = {
        "kind": "header",
        "quantities": [{"name": q, "key": q} for q in quantities],
        "params": [{"name": p, "shape": [1], "numel": 1} for p in params],
    }
    records = [header] + [{"kind": "values", "step": s, "values": v} for s, v in values.items()]
    path.write_text("".join(dumps(r) + "\n" for r in records))
    return path


def _panels(logs, **options):
    payload = Feed(logs, diagnose=False, **options).payload()
    for panel in payload["panels"]:
        go.Figure(panel["figure"])  # every figure is valid for plotly
    return {p["id"]: p for p in payload["panels"]}, payload


def _traces(panel):
    return {t["name"]: t for t in panel["figure"]["data"]}


def _shown(value):
    """A logged number as the view shows it: non-finite values are gaps."""
    return float(value) if math.isfinite(value) else None


def _steps(run, name):
    return sorted(s for s in run.output if name in run.output[s])


def test_activations_get_one_line_per_module_on_log_axes(new_log):
    run = read_run(new_log)
    panels, payload = _panels([new_log])
    steps = _steps(run, "activations")
    modules = list(run.output[steps[0]]["activations"]["modules"])
    assert len(steps) == STEPS and modules == ["0", "2", "4"]  # the MLP's three Linear layers
    for panel_id, field in (("activations_rms", "rms"), ("activations_amax", "amax")):
        panel = panels[panel_id]
        assert panel["topic"] == "forward pass" and panel["quantities"] == ["activations"]
        traces = panel["figure"]["data"]
        assert [t["name"] for t in traces] == modules  # one line per module, named after it
        for j, trace in enumerate(traces):
            assert list(trace["x"]) == steps
            expected = [float(run.output[s]["activations"][field][j]) for s in steps]
            assert list(trace["y"]) == expected
        assert panel["figure"]["layout"]["yaxis"]["type"] == "log"
        assert panel["points"] == len(steps) * len(modules)
    assert not [i for i in panels if i.startswith("q-")]  # no generic panel left
    topics = payload["topics"]
    assert topics.index("curvature") < topics.index("forward pass") < topics.index("performance")


def test_logits_panel_draws_log_z_and_the_largest_logit(new_log):
    run = read_run(new_log)
    panel = _panels([new_log])[0]["logits_log_z"]
    traces = _traces(panel)
    fields = ["log_z_max", "log_z_mean", "max_logit"]
    assert sorted(traces) == [f"logits/{f}" for f in fields]  # z_loss is on another scale
    steps = _steps(run, "logits")
    for field in fields:
        assert list(traces[f"logits/{field}"]["x"]) == steps
        assert list(traces[f"logits/{field}"]["y"]) == [
            run.output[s]["logits"][field] for s in steps
        ]
    assert panel["figure"]["layout"]["yaxis"]["title"]["text"] == "logits"


def test_parameter_norm_and_update_ratio_in_total_and_per_parameter(new_log):
    run = read_run(new_log)
    params = [p["name"] for p in run.header["params"]]
    panels, _ = _panels([new_log])
    ids = list(panels)
    assert ids.index("update_ratio") < ids.index("param_norm") < ids.index("param_norm_layers")
    assert not {"param_norm-per_param", "update_ratio-per_param"} & set(panels)  # no duplicate
    steps = _steps(run, "param_norm")
    (total,) = panels["param_norm"]["figure"]["data"]
    assert total["name"] == "param_norm/total"
    assert list(total["y"]) == [run.output[s]["param_norm"]["total"] for s in steps]
    layers = panels["param_norm_layers"]["figure"]["data"]
    assert [t["name"] for t in layers] == params  # the header's parameter names
    for j, trace in enumerate(layers):
        assert list(trace["y"]) == [
            float(run.output[s]["param_norm"]["per_param"][j]) for s in steps
        ]
    ratio = panels["update_ratio"]
    steps = _steps(run, "update_ratio")
    assert len(steps) == STEPS - 1  # the last step's update is not taken
    traces = ratio["figure"]["data"]
    names = ["update_ratio/total"] + [f"update_ratio/per_param/{p}" for p in params]
    assert [t["name"] for t in traces] == names
    assert list(traces[0]["y"]) == [run.output[s]["update_ratio"]["total"] for s in steps]
    for j, trace in enumerate(traces[1:]):
        assert list(trace["x"]) == steps
        expected = [float(run.output[s]["update_ratio"]["per_param"][j]) for s in steps]
        assert list(trace["y"]) == expected
    assert ratio["figure"]["layout"]["yaxis"]["type"] == "log"


def test_noise_scale_of_a_real_run_is_its_b_simple_and_batch_size(new_log):
    run = read_run(new_log)
    traces = _traces(_panels([new_log])[0]["noise_scale"])
    assert sorted(traces) == ["noise_scale/b_simple", "noise_scale/batch_size"]
    steps = _steps(run, "noise_scale")
    b_simple = [_shown(run.output[s]["noise_scale"]["b_simple"]) for s in steps]
    assert list(traces["noise_scale/b_simple"]["y"]) == b_simple
    assert list(traces["noise_scale/batch_size"]["y"]) == [8] * len(steps)  # tiny_mlp's batch


def test_noise_scale_has_error_bars_of_its_standard_error(tmp_path):
    logged = {  # noise_scale's fields; se is NaN below three samples
        0: (40.0, 5.0, 2.0, 0.05, 8),
        1: (30.0, float("nan"), 1.5, 0.05, 2),
        2: (-12.0, 7.5, 0.6, -0.05, 8),  # a negative |G|^2 estimate: linear axis
    }
    values = {
        s: {"noise_scale": dict(zip(("b_simple", "se", "trace_cov", "grad_sq", "batch_size"), v))}
        for s, v in logged.items()
    }
    log = _write(tmp_path / "log.jsonl", ["noise_scale"], values)
    panel = _panels([log])[0]["noise_scale"]
    b_simple = _traces(panel)["noise_scale/b_simple"]
    assert list(b_simple["y"]) == [40.0, 30.0, -12.0]
    assert b_simple["error_y"]["array"] == [5.0, None, 7.5]
    assert panel["figure"]["layout"]["yaxis"]["type"] == "linear"
    assert panel["topic"] == "gradient"


def test_attention_lines_per_layer_reduce_over_heads(tmp_path):
    max_logit = np.random.default_rng(0).normal(size=(3, 2, 4)) * 5  # steps, layers, heads
    entropy = np.random.default_rng(1).uniform(0.1, 2.0, size=(3, 2, 4))
    modules = ["h.0.attn", "h.1.attn"]
    values = {
        s: {
            "attention": {
                "modules": modules,
                "heads": [4, 4],
                "max_logit": max_logit[s].tolist(),
                "entropy": entropy[s].tolist(),
                "max": float(max_logit[s].max()),
                "min_entropy": float(entropy[s].min()),
                "sampled": None,
            }
        }
        for s in range(3)
    }
    panels, _ = _panels([_write(tmp_path / "log.jsonl", ["attention"], values)])
    logits = panels["attention_max_logit"]["figure"]["data"]
    assert [t["name"] for t in logits] == modules
    for j, trace in enumerate(logits):
        assert list(trace["y"]) == [max(max_logit[s, j]) for s in range(3)]  # max over heads
    entropies = _traces(panels["attention_entropy"])
    assert sorted(entropies) == ["attention/entropy/h.0.attn", "attention/entropy/h.1.attn"] + [
        "attention/min_entropy"
    ]
    for j, module in enumerate(modules):
        expected = [min(entropy[s, j]) for s in range(3)]  # the lowest head of each layer
        assert list(entropies[f"attention/entropy/{module}"]["y"]) == expected
    assert list(entropies["attention/min_entropy"]["y"]) == [entropy[s].min() for s in range(3)]
    assert panels["attention_entropy"]["topic"] == "forward pass"


def _draw(ax, output, header):
    """Never called here: the web view reads the chart."""


WIGGLE = Instrument(
    name="wiggle_panel",
    title="Wiggle amplitude",
    topic="wobbles",
    quantities=("wiggle",),
    draw=_draw,
    chart=Chart(
        {"wiggle": ("amplitude", Each("per_unit", names="units", reduce="mean"))}, log_y=True
    ),
)


class _WigglePlugin:
    @staticmethod
    @hookimpl
    def register_instruments(register):
        register(WIGGLE)


@pytest.fixture
def wiggle_log(tmp_path):
    values = {
        s: {
            "wiggle": {
                "amplitude": 2.0**s,
                "phase": 0.1 * s,
                "units": ["left", "right"] if s < 2 else ["right", "new"],
                "per_unit": [[1.0, 3.0 + s], [s, 4.0]] if s < 2 else [[5.0, 6.0], [7.0, 9.0]],
            }
        }
        for s in range(3)
    }
    return _write(tmp_path / "log.jsonl", ["loss", "wiggle"], values)


def test_a_third_party_chart_shows_up_in_its_own_section(wiggle_log):
    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic")
    registry.add_plugin(_WigglePlugin, name="wiggle")
    panels, payload = _panels([wiggle_log], registry=registry)
    panel = panels["wiggle_panel"]
    assert (panel["title"], panel["topic"]) == ("Wiggle amplitude", "wobbles")
    assert payload["topics"][-3:] == ["wobbles", "performance", "other"]
    traces = _traces(panel)
    assert sorted(traces) == [
        "wiggle/amplitude",  # the phase is not listed: not drawn
        "wiggle/per_unit/left",
        "wiggle/per_unit/new",
        "wiggle/per_unit/right",
    ]
    assert list(traces["wiggle/amplitude"]["y"]) == [1.0, 2.0, 4.0]
    assert list(traces["wiggle/per_unit/left"]["y"]) == [2.0, 2.5, None]  # means, by name
    assert list(traces["wiggle/per_unit/right"]["y"]) == [2.0, 2.5, 5.5]
    assert list(traces["wiggle/per_unit/new"]["y"]) == [None, None, 8.0]
    assert panel["figure"]["layout"]["yaxis"]["type"] == "log"
    assert "q-wiggle" not in panels


def test_without_the_chart_a_quantity_gets_its_generic_panel(wiggle_log):
    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic")
    panels, _ = _panels([wiggle_log], registry=registry)
    assert sorted(_traces(panels["q-wiggle"])) == ["wiggle/amplitude", "wiggle/phase"]
    assert panels["q-wiggle"]["topic"] == "other"


def test_two_runs_overlay_their_lines_per_entry_in_their_colours(wiggle_log, tmp_path):
    registry = Registry()
    registry.add_plugin(_WigglePlugin, name="wiggle")
    panels, _ = _panels([wiggle_log, wiggle_log], registry=registry, labels=["a", "b"])
    traces = panels["wiggle_panel"]["figure"]["data"]
    entries = [t for t in traces if "per_unit" in t["name"]]
    assert [t["name"] for t in entries[:3]] == [
        f"a: wiggle/per_unit/{u}" for u in ("left", "right", "new")
    ]
    assert {t["line"]["color"] for t in entries[:3]} != {t["line"]["color"] for t in entries[3:]}
    assert len({t["line"]["color"] for t in entries[:3]}) == 1
