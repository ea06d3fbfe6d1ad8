"""An exception in ``StepRun.__enter__`` is the one the user sees, also through cleanup code.

Framework integrations leave a step with ``run.__exit__(type(err), err, tb)`` when
training stops (Lightning's ``on_exception``); for a step whose ``__enter__`` raised, that
must do nothing rather than fail with an ``AttributeError`` of half-set state, and the
Cockpit must be usable for the next step.
"""

from __future__ import annotations

import pytest

from cockpit_core import Cockpit, MisuseError
from cockpit_core.testing import tiny_mlp

QUANTITIES = ["loss", "grad_norm", "norm_test", "update_size", "hess_max_ev"]


def setup():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model, QUANTITIES, loss_fn=problem.loss_module())
    return problem, model, cp


def loss_of(problem, model, step):
    x, y = problem.batch(step)
    return problem.loss_module()(model(x), y)


def test_an_early_failure_propagates_and_exit_does_nothing():
    problem, model, cp = setup()
    loss = loss_of(problem, model, 0)
    run = cp(0, loss=loss, info={"grad_scaler": "not a scaler"})
    with pytest.raises(MisuseError, match="grad_scaler") as err:
        run.__enter__()
    assert run.__exit__(err.type, err.value, err.tb) is False  # no AttributeError
    with cp(0, loss=loss):  # the step can be taken again
        loss.backward()
    assert set(cp.get_output()[0]) >= {"loss", "grad_norm", "norm_test", "hess_max_ev"}


def test_a_late_failure_undoes_the_block_and_the_next_step_runs(monkeypatch):
    problem, model, cp = setup()
    tracker = cp._tracker

    def boom(*args, **kwargs):
        raise RuntimeError("boom in __enter__")

    monkeypatch.setattr(tracker.cost, "entered", boom)  # after the providers were entered
    loss = loss_of(problem, model, 0)
    run = cp(0, loss=loss)
    with pytest.raises(RuntimeError, match="boom in __enter__") as err:
        with run:
            raise AssertionError("the block must not run")
    assert not tracker.in_step
    assert run.__exit__(err.type, err.value, err.tb) is False
    monkeypatch.undo()
    loss.backward()  # PyTorch's own backward: nothing of cockpit's left in it
    for step in (1, 2):
        model.zero_grad()
        loss = loss_of(problem, model, step)
        with cp(step, loss=loss):
            loss.backward()
    out = cp.get_output()
    assert sorted(out) == [1, 2] and set(out[2]) >= {"norm_test", "hess_max_ev"}
    assert cp.errors == []
