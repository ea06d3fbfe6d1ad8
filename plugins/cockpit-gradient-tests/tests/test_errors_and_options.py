"""Missing info keys, bad input, and the options that go beyond Cockpit 1.0.2 (CABS learning rates)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cockpit_gradient_tests import CABS, MeanGSNR, NormTest

from cockpit_core import Cockpit, CockpitWarning, MissingInfoError
from cockpit_core.testing import run_cockpit, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients


def _step(cp, problem, model, step, info_keys=("loss", "batch_size", "optimizer"), opt=None):
    """One training step of ``problem`` with only ``info_keys`` passed to the Cockpit."""
    x, y = problem.batch(step)
    model.zero_grad()
    loss = problem.loss_module()(model(x), y)
    info = {"loss": loss, "batch_size": len(x), "optimizer": opt}
    with cp(step, info={k: info[k] for k in info_keys}):
        loss.backward()
    return x, y, float(loss.detach())


@pytest.mark.parametrize(
    "quantity, given, missing",
    [
        ("cabs", ("loss", "batch_size"), "optimizer"),
        ("cabs", ("batch_size", "optimizer"), "loss"),
        (CABS(lr=0.1), ("batch_size",), "loss"),
        ("norm_test", ("loss",), "batch_size"),
        ("mean_gsnr", ("loss", "optimizer"), "batch_size"),
    ],
)
def test_missing_info_is_reported_when_the_step_begins(quantity, given, missing):
    problem = tiny_mlp()
    model = problem.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model.named_parameters(), [quantity])
    name = quantity if isinstance(quantity, str) else quantity.name
    with pytest.raises(MissingInfoError, match=rf"'{name}' needs info\['{missing}'\]"):
        _step(cp, problem, model, 0, given, opt)


def test_cabs_with_lr_option_needs_no_optimizer():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), [CABS(lr=0.1)], on_error="raise")
    _step(cp, problem, model, 0, ("loss", "batch_size"))
    assert math.isfinite(cp.get_output()[0]["cabs"]["total"])


def test_cabs_lr_option_equals_lr_from_optimizer():
    with_opt = run_cockpit(tiny_mlp(), ["cabs"], steps=2, on_error="raise").output
    fixed = run_cockpit(tiny_mlp(), [CABS(lr=0.1)], steps=2, on_error="raise").output
    for step in (0, 1):
        np.testing.assert_allclose(
            with_opt[step]["cabs"]["per_param"], fixed[step]["cabs"]["per_param"], rtol=1e-15
        )


def test_cabs_uses_each_param_groups_learning_rate():
    """Cockpit 1.0.2 raises for non-unique learning rates; here each group weighs its own trace."""
    problem = tiny_mlp()
    model = problem.make_model()
    params = list(model.parameters())
    lrs = [0.1, 0.1, 0.02, 0.02, 0.3, 0.3]
    opt = torch.optim.SGD(
        [{"params": params[:2], "lr": 0.1}, {"params": params[2:4], "lr": 0.02}],
        lr=0.3,
        momentum=0.9,
    )
    opt.add_param_group({"params": params[4:]})
    cp = Cockpit(model.named_parameters(), ["cabs"], on_error="raise")
    x, y, loss = _step(cp, problem, model, 0, opt=opt)
    grads = per_sample_gradients(model, problem, x, y)
    # Balles et al. (2017), Eq. (22), per group: lr * tr(population covariance) / loss
    expected = [
        lr * float(g.flatten(1).var(0, correction=0).sum()) / loss for g, lr in zip(grads, lrs)
    ]
    value = cp.get_output()[0]["cabs"]
    np.testing.assert_allclose(value["per_param"], expected, rtol=1e-10)
    assert value["total"] == pytest.approx(sum(expected), rel=1e-10)


# the core also warns that the optimizer and the Cockpit track different parameters
@pytest.mark.filterwarnings("ignore:.*does not update")
def test_cabs_names_parameters_the_optimizer_does_not_train():
    problem = tiny_mlp()
    model = problem.make_model()
    opt = torch.optim.SGD(list(model.parameters())[:2], lr=0.1)
    cp = Cockpit(model.named_parameters(), ["cabs"])
    with pytest.warns(CockpitWarning, match=r"parameters \['2.weight'.*in no param group"):
        _step(cp, problem, model, 0, opt=opt)
    assert "set the quantity's 'lr' option" in cp.errors[0]["error"]


def test_cabs_rejects_an_object_without_param_groups():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["cabs"])
    with pytest.warns(CockpitWarning, match="param_groups"):
        _step(cp, problem, model, 0, opt="sgd")


def test_batch_of_one_gives_a_clear_error_and_training_goes_on():
    problem = tiny_mlp(batch_size=1)
    with pytest.warns(CockpitWarning, match="at least 2 samples per mini-batch"):
        result = run_cockpit(problem, [NormTest(), MeanGSNR()], steps=2)
    # the norm test needs a sample variance (B - 1); the mean GSNR divides by B and works
    assert all("norm_test" not in v and "mean_gsnr" in v for v in result.output.values())
    assert len(result.cockpit.errors) == 2


def test_zero_gradient_gives_nan_not_an_exception():
    """With g = 0 the tests are undefined (0/0); the value is NaN and nothing raises."""
    problem = tiny_mlp()
    model = problem.make_model()
    names = ["norm_test", "inner_test", "ortho_test", "mean_gsnr", "early_stopping"]
    cp = Cockpit(model.named_parameters(), names, on_error="raise")
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y) * 0.0
    with cp(0, info={"loss": loss, "batch_size": len(x)}):
        loss.backward()
    out = cp.get_output()[0]
    for name in ("norm_test", "inner_test", "ortho_test"):
        assert math.isnan(out[name]["total"])
    assert out["mean_gsnr"]["total"] == 0.0
    assert out["early_stopping"]["total"] == 1.0
