"""Protocol checks, the entry point, the preset and the dashboard panels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cockpit_health import QUANTITIES, NoiseScale, ParamNorm, UpdateRatio
from cockpit_health.instruments import INSTRUMENTS
from cockpit_health.plugin import HEALTH

from cockpit_core import default_registry
from cockpit_core.testing import (
    check_instrument,
    check_plugin,
    check_quantity,
    run_cockpit,
    tiny_cnn,
    tiny_mlp,
)

PANELS = {i.name: i for i in INSTRUMENTS}


@pytest.mark.parametrize("cls", QUANTITIES, ids=lambda c: c.name)
def test_check_quantity(cls):
    check_quantity(cls)


@pytest.mark.parametrize("cls", QUANTITIES, ids=lambda c: c.name)
def test_check_quantity_on_cnn(cls):
    check_quantity(cls, problem=tiny_cnn())


def test_everything_the_plugin_registers():
    report = check_plugin("health")
    assert report.checked == [
        "quantity param_norm",
        "quantity update_ratio",
        "quantity noise_scale",
        "quantity noise_scale_cheap",
        "preset health",
        "instrument update_ratio",
        "instrument param_norm",
        "instrument param_norm_layers",
        "instrument noise_scale",
    ]


def test_registered_names_and_the_health_preset():
    registry = default_registry()
    for cls in (ParamNorm, UpdateRatio, NoiseScale):
        assert registry.quantities[cls.name].distribution == "cockpit-health"
    assert HEALTH == [
        "loss",
        "grad_norm",
        "param_norm",
        "update_ratio",
        "activations",
        "logits",
        {"name": "attention", "entropy": False},
    ]
    preset = registry.presets["health"]
    assert list(preset.quantities) == HEALTH
    assert preset.distribution == "cockpit-health"


def test_the_health_preset_tracks_its_quantities():
    result = run_cockpit(tiny_mlp(), "health", steps=3, on_error="raise", attach=True)
    names = {q if isinstance(q, str) else q["name"] for q in HEALTH}
    assert set(result.output[0]) == names
    assert set(result.output[2]) == names - {"update_ratio"}  # its end step never came


def _noise(b: float, se: float, trace: float = 1.0, signal: float = 0.1) -> dict:
    return {"b_simple": b, "se": se, "trace_cov": trace, "grad_sq": signal, "batch_size": 8}


@pytest.mark.parametrize(
    "output",
    [
        {0: {"noise_scale": _noise(10.0, 2.0)}},  # a single step
        {s: {"noise_scale": _noise(math.inf, math.inf, signal=-0.1)} for s in range(4)},
        {
            0: {"noise_scale": _noise(3.0, 1.0)},
            1: {"noise_scale": _noise(math.inf, math.inf, signal=-0.1)},
            2: {"noise_scale": _noise(300.0, 500.0)},  # wide: log axis, band clipped
            3: {"noise_scale": _noise(math.nan, math.nan, trace=0.0, signal=0.0)},
        },
    ],
    ids=["one_step", "never_detected", "mixed"],
)
def test_noise_scale_panel_draws_degenerate_values(output):
    check_instrument(PANELS["noise_scale"], output=output)


def test_update_ratio_panel_draws_inf_nan_and_zero_ratios():
    per = np.array([1e-3, np.inf, np.nan, 0.0])
    output = {s: {"update_ratio": {"total": 1e-3 * (s + 1), "per_param": per}} for s in range(3)}
    fig = check_instrument(PANELS["update_ratio"], output=output)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    low, high = ax.get_ylim()
    assert low <= 1e-4 and high >= 1e-2  # the healthy band is in view


@pytest.mark.parametrize("name", ["param_norm", "param_norm_layers"])
def test_param_norm_panels_draw_one_step(name):
    output = {3: {"param_norm": {"total": 2.0, "per_param": np.array([1.0, 1.5, 0.5])}}}
    check_instrument(PANELS[name], output=output)
