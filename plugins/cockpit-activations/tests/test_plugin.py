"""The plugin: registration, protocol, the log, the panels, and a Cockpit without the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_activations import Activations, Logits
from cockpit_activations.instruments import INSTRUMENTS, module_series

from cockpit_core import Cockpit, ConfigError
from cockpit_core.log import dumps, loads
from cockpit_core.plugin.registry import default_registry
from cockpit_core.quantity import check_quantity_class
from cockpit_core.testing import (
    check_instrument,
    check_plugin,
    check_quantity,
    run_cockpit,
    tiny_mlp,
)
from cockpit_core.testing.models import NanoGPT


def _nanogpt_run(steps: int = 4):
    torch.manual_seed(0)
    model = NanoGPT(vocab=40).double()
    cp = Cockpit(
        model,
        [
            "activations",
            "logits",
            {"name": "activations", "label": "lp", "low_precision": ["float16"]},
        ],
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        idx = torch.randint(0, 40, (2, 8), generator=gen)
        loss = model(idx, idx)[1]
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
        opt.zero_grad()
    assert not cp.errors
    return cp


def test_registered_through_the_entry_point():
    registry = default_registry()
    assert registry.quantities["activations"].cls is Activations
    assert registry.quantities["logits"].cls is Logits
    assert {"activations_rms", "activations_amax", "logits_log_z"} <= set(registry.instruments)


@pytest.mark.parametrize("cls", [Activations, Logits])
def test_protocol_options_and_log_round_trip(cls):
    check_quantity_class(cls)
    for name, field in cls.Config.model_fields.items():
        assert not field.is_required() and field.description, name
    typo = {"low_precison": ["float16"]} if cls is Activations else {"coeff": 1.0}
    with pytest.raises(ConfigError, match="did you mean"):
        cls(**typo)
    check_quantity(cls)  # attaches the model: the quantity declares probes
    result = run_cockpit(tiny_mlp(), [cls()], steps=3, attach=True, on_error="raise")
    assert not result.cockpit.errors
    for values in result.output.values():
        value = values[cls.name]
        back = loads(dumps({"v": value}))["v"]
        assert back.keys() == value.keys()
        for key, v in value.items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(back[key], v)
            else:
                assert back[key] == v


def test_nested_low_precision_arrays_survive_the_log():
    value = _nanogpt_run(1).get_output()[0]["lp"]
    back = loads(dumps({"v": value}))["v"]
    assert back["modules"] == value["modules"]
    np.testing.assert_array_equal(back["underflow"]["float16"], value["underflow"]["float16"])
    np.testing.assert_array_equal(back["overflow"]["float16"], value["overflow"]["float16"])


def test_without_the_model_the_error_is_recorded_and_training_goes_on():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    cp = Cockpit(model.parameters(), ["activations", "logits", "loss"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 4)
    with pytest.warns(UserWarning, match="give it the model"):
        for step in range(3):
            if step == 2:
                cp.attach(model)  # from now on the forward pass is read
            loss = model(x).square().mean()
            with cp(step, loss=loss):
                loss.backward()
            opt.step()
            opt.zero_grad()
    errors = cp.errors
    assert {(e["step"], e["quantity"]) for e in errors} == {
        (s, q) for s in (0, 1) for q in ("activations", "logits")
    }
    for error in errors:
        assert "UnsupportedModelError" in error["error"] and "cp.attach(model)" in error["error"]
    out = cp.get_output()
    assert all("loss" in out[s] for s in range(3))
    assert out[2]["activations"]["modules"] == ["0", "2"] and "logits" in out[2]


def test_module_series_matches_modules_by_name():
    output = {
        0: {"activations": {"modules": ["a", "b"], "rms": np.array([1.0, 2.0])}},
        1: {"activations": {"modules": ["b", "c"], "rms": np.array([3.0, 4.0])}},
        2: {"other": 1.0},
    }
    steps, modules, table = module_series(output, "activations", "rms")
    assert steps.tolist() == [0, 1] and modules == ["a", "b", "c"]
    np.testing.assert_array_equal(table, [[1.0, 2.0, np.nan], [np.nan, 3.0, 4.0]])


@pytest.mark.parametrize("inst", INSTRUMENTS, ids=lambda i: i.name)
def test_every_panel_draws_a_real_run(inst):
    output = _nanogpt_run().get_output()
    check_instrument(inst, output=output)


def test_panels_draw_many_modules_zeros_and_gaps():
    modules = [f"m.{i}" for i in range(14)]
    output = {
        step: {
            "activations": {
                "modules": modules[: 14 - step],
                "rms": np.linspace(0.0 if step == 1 else 0.5, 3.0, 14 - step),
                "amax": np.full(14 - step, np.nan if step == 2 else 4.0),
                "zero_frac": np.zeros(14 - step),
            },
            "logits": {
                "log_z_mean": 3.0,
                "log_z_max": float("inf"),
                "max_logit": 2.0,
                "z_loss": 1e-3,
            },
        }
        for step in range(4)
    }
    for inst in INSTRUMENTS:
        check_instrument(inst, output=output)


def test_check_plugin_with_the_quantities_checked_above():
    # the panels are drawn on a real run's output
    output = _nanogpt_run().get_output()
    report = check_plugin(
        "activations", arguments={i.name: {"output": output} for i in INSTRUMENTS}
    )
    assert {"quantity activations", "quantity logits"} <= set(report.checked)
    assert {f"instrument {i.name}" for i in INSTRUMENTS} <= set(report.checked)
