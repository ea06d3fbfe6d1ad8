"""The compat Cockpit: keys, schedules, verbose/debug, add, log and custom extensions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_compat import Cockpit, quantities
from cockpit_compat.utils import schedules

from cockpit_core.testing.problems import tiny_mlp
from cockpit_core.testing.reference import explicit_hessian

EVERY = schedules.linear(1)


def train(cockpit, problem, model, steps, exts=(), debug=False, between=None):
    """A Cockpit 1.0.2-style loop; returns the parameters at every step and at the end."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = problem.loss_module()
    thetas = []
    for step in range(steps):
        x, y = problem.batch(step)
        thetas.append([p.detach().clone() for p in model.parameters()])
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        info = {
            "loss": loss,
            "individual_losses": problem.individual_losses(out, y),
            "batch_size": len(x),
            "optimizer": opt,
        }
        with cockpit(step, *exts, info=info, debug=debug):
            loss.backward(create_graph=cockpit.create_graph(step))
        opt.step()
        if between is not None:
            between(step)
    thetas.append([p.detach().clone() for p in model.parameters()])
    return thetas


@pytest.fixture
def problem():
    return tiny_mlp(batch_size=6)


def test_distance_measures_from_step_zero_and_reports_only_scheduled_steps(problem):
    model = problem.make_model()
    distance = quantities.Distance(schedules.linear(2, offset=1))
    cp = Cockpit(model.parameters(), [distance])
    thetas = train(cp, problem, model, 4)
    out = cp.get_output()
    assert sorted(out) == [1, 3]  # step 0 was tracked natively (the start), then dropped
    for s in (1, 3):
        expected = [float((p - p0).norm()) for p, p0 in zip(thetas[s], thetas[0])]
        np.testing.assert_allclose(out[s]["Distance"], expected, rtol=1e-12)
    assert distance.get_output() == {s: out[s]["Distance"] for s in (1, 3)}


def test_two_instances_of_a_class_get_numbered_keys(problem):
    model = problem.make_model()
    first, second = quantities.GradNorm(EVERY), quantities.GradNorm(schedules.linear(2))
    cp = Cockpit(model.parameters(), [first, second])
    assert [q.key for q in cp.native.quantities] == ["grad_norm", "grad_norm_2"]
    train(cp, problem, model, 3)
    out = cp.get_output()
    assert [sorted(out[s]) for s in range(3)] == [
        ["GradNorm", "GradNorm_2"],
        ["GradNorm"],
        ["GradNorm", "GradNorm_2"],
    ]
    assert out[2]["GradNorm"] == out[2]["GradNorm_2"]
    assert sorted(second.get_output()) == [0, 2]
    assert cp.quantities == [first, second]


def test_verbose_prints_each_stored_value_and_debug_prints_the_step(problem, capsys):
    model = problem.make_model()
    cp = Cockpit(
        model.parameters(), [quantities.Loss(EVERY, verbose=True), quantities.GradNorm(EVERY)]
    )
    train(cp, problem, model, 2, debug=True)
    printed = capsys.readouterr().out
    out = cp.get_output()
    for s in (0, 1):
        assert f"[Step {s} | Loss]: Store iteration {s}, value {out[s]['Loss']}" in printed
        assert f"[cockpit] step {s}: grad_norm" in printed
    assert "| GradNorm]" not in printed
    assert cp.native.debug is False


def test_add_tracks_from_the_next_step_and_log_merges_metrics(problem):
    model = problem.make_model()
    cp = Cockpit(model.parameters(), [quantities.Loss(EVERY)])
    hess_trace = quantities.HessTrace(EVERY, curvature="diag_ggn_exact")

    def between(step):
        if step == 0:
            cp.add(hess_trace)
            cp.log(step, 0, 2.0, 2.5, None, 0.25, 0.2, None, 0.1)

    train(cp, problem, model, 3, between=between)
    out = cp.get_output()
    assert "HessTrace" not in out[0] and all("HessTrace" in out[s] for s in (1, 2))
    assert {k: out[0][k] for k in out[0] if k != "Loss"} == {
        "epoch_count": 0,
        "train_loss": 2.0,
        "valid_loss": 2.5,
        "train_accuracy": 0.25,
        "valid_accuracy": 0.2,
        "learning_rate": 0.1,
    }  # None: not measured, as the native log
    native = cp.native.get_output()[1]["hess_trace"]
    assert out[1]["HessTrace"] == [float(v) for v in native["per_param"]]
    assert hess_trace.get_output()[2] == out[2]["HessTrace"]
    assert cp.output == out


def test_native_quantities_pass_through_and_others_are_refused(problem):
    from cockpit_core import default_registry

    model = problem.make_model()
    native = default_registry().get("grad_norm")({"label": "norms"})
    cp = Cockpit(model.parameters(), [quantities.Loss(EVERY), native])
    train(cp, problem, model, 1)
    value = cp.get_output()[0]["norms"]
    assert set(value) == {"total", "per_param"} and len(value["per_param"]) == 6
    with pytest.raises(ValueError, match="instances of Quantity"):
        cp.add("grad_norm")
    with pytest.raises(ValueError, match="instances of Quantity"):
        Cockpit(model.parameters(), [quantities.GradNorm])
    assert Cockpit(model.parameters()).quantities == []


def test_custom_extensions_leave_their_results_on_the_parameters(problem, monkeypatch):
    import backpack
    from backpack.extensions import DiagHessian

    from cockpit_core.testing import problems

    # a 1.0.2 script extends with BackPACK's own extend, whose hooks stay on for good, so
    # extensions work from the first step (docs/quickstart.md); cockpit_backpack.extend's hooks
    # would be off at this step unless some other live Cockpit happened to want them
    monkeypatch.setattr(problems, "prepared", backpack.extend)
    model = problem.make_model()
    cp = Cockpit(model.parameters(), [quantities.GradNorm(EVERY)])
    x, y = problem.batch(0)
    out = model(x)
    loss = problem.loss_module()(out, y)
    info = {"loss": loss, "individual_losses": problem.individual_losses(out, y), "batch_size": 6}
    with cp(0, DiagHessian(), info=info):
        loss.backward(create_graph=cp.create_graph(0))
    diagonal = torch.cat([p.diag_h.flatten() for p in model.parameters()])
    torch.testing.assert_close(diagonal, explicit_hessian(model, problem, x, y).diagonal())
    assert sorted(cp.get_output()[0]) == ["GradNorm"]
