"""BackPACK's hooks are installed only for forward passes whose backward is tracked."""

from __future__ import annotations

import gc
import warnings

import backpack
import pytest
import torch
from cockpit_backpack import hook_switch as hooks

from cockpit_core import Cockpit, CockpitWarning
from cockpit_core.testing.problems import tiny_cnn

QUANTITIES = [
    {"name": "norm_test", "every": 4},
    {"name": "alpha", "every": 4},  # two steps: 0-1, 4-5, 8-9
    {"name": "grad_norm"},  # every step, needs no per-sample statistic
]
NEEDS_HOOKS = {0, 1, 4, 5, 8, 9}


def _hooked(model: torch.nn.Module) -> bool:
    layer = model[0]
    return bool(layer._forward_hooks) and bool(layer._backward_hooks)


def _train(steps, *, switchable=True, prepare=False, record=None):
    gc.collect()  # unclosed Cockpits of earlier tests that still want the hooks
    problem = tiny_cnn()
    torch.manual_seed(0)
    model = problem.make_model()
    if switchable:
        model = hooks.extend(model)
        loss_fn = problem.loss_module()
    else:  # BackPACK's own extend: the hooks are never removed
        model = backpack.extend(model)
        loss_fn = backpack.extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model.named_parameters(), QUANTITIES)
    for step in steps:
        if prepare:
            cp.prepare(step)
        if record is not None:
            record[step] = _hooked(model)
        x, y = problem.batch(step)
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        info = {
            "loss": loss,
            "individual_losses": problem.individual_losses(out, y),
            "optimizer": opt,
        }
        with cp(step, info=info):
            loss.backward()
        opt.step()
    cp.close()
    return cp


def test_hooks_are_installed_exactly_for_the_steps_that_need_them():
    record: dict[int, bool] = {}
    cp = _train(range(12), record=record)
    assert record == {s: s in NEEDS_HOOKS for s in range(12)}
    assert cp.errors == []
    # the closed Cockpit no longer asks for anything; the hooks are then on unless another
    # live Cockpit (e.g. one an earlier test leaked) wants them off
    provider = cp._router.providers["backpack"]
    assert provider not in hooks._wants
    assert hooks.installed() == (not hooks._wants or any(hooks._wants.values()))


def test_values_equal_a_run_whose_hooks_are_never_removed():
    ours = _train(range(12)).get_output()
    always = _train(range(12), switchable=False).get_output()
    assert ours.keys() == always.keys()
    for step, values in always.items():
        assert ours[step].keys() == values.keys()
        for key, value in values.items():
            if isinstance(value, float):
                assert ours[step][key] == pytest.approx(value, rel=1e-12, abs=1e-15), (step, key)


def test_an_unexpected_step_is_reported_and_the_hooks_stay_on():
    steps = [0, 1, 2, 4, 5, 6, 8]  # after 2 the Cockpit expects 3 (untracked), gets 4
    with pytest.warns(CockpitWarning, match=r"cp\.prepare\(step\)"):
        cp = _train(steps)
    errors = {(e["step"], e["quantity"]) for e in cp.errors}
    assert errors == {(4, "norm_test"), (4, "alpha")}
    assert all(
        "the statistics provider(s) 'backpack' did not observe it" in e["error"] for e in cp.errors
    )
    out = cp.get_output()
    assert "norm_test" in out[8] and "grad_norm" in out[4]  # training and tracking go on
    assert "alpha" not in out.get(4, {})


def test_prepare_before_the_forward_pass_handles_irregular_steps():
    steps = [0, 1, 2, 4, 5, 6, 8]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        cp = _train(steps, prepare=True)
    assert cp.errors == []
    assert {"norm_test", "alpha"} <= cp.get_output()[4].keys()


def test_a_new_cockpit_reinstalls_the_hooks():
    gc.collect()  # unclosed Cockpits of earlier tests that still want the hooks
    problem = tiny_cnn()
    model = hooks.extend(problem.make_model())
    first = Cockpit(model.parameters(), [{"name": "norm_test", "every": 10}])
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with first(0, info={"loss": loss, "batch_size": len(x)}):
        loss.backward()
    assert not _hooked(model)  # step 1 tracks nothing
    second = Cockpit(model.parameters(), ["norm_test"])
    assert _hooked(model)
    first.close()
    second.close()
