"""The update predictors against real torch.optim steps; the parabola fit on known parabolas."""

import math

import numpy as np
import pytest
import torch
from cockpit_alpha._directions import UpdatePredictor, generic_direction, optimizer_kind
from cockpit_alpha._fit import fit_quadratic, normalized_step

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_wd_momentum": lambda ps: torch.optim.SGD(
        ps, lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01
    ),
    "sgd_nesterov_maximize": lambda ps: torch.optim.SGD(
        ps, lr=0.1, momentum=0.8, nesterov=True, maximize=True
    ),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam_l2_amsgrad_foreach": lambda ps: torch.optim.Adam(
        ps, lr=0.01, weight_decay=0.1, amsgrad=True, foreach=True
    ),
    "adam_decoupled": lambda ps: torch.optim.Adam(
        ps, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True
    ),
    "adamw_maximize": lambda ps: torch.optim.AdamW(
        ps, lr=0.01, betas=(0.8, 0.9), weight_decay=0.2, maximize=True
    ),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01),
    "rmsprop_centered_momentum_wd": lambda ps: torch.optim.RMSprop(
        ps, lr=0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.01
    ),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_predicted_update_equals_the_real_update(name):
    """Four steps on two parameter groups with different learning rates."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64)) for _ in range(2)]
    opt = OPTIMIZERS[name]([params[0]])
    opt.add_param_group({"params": [params[1]], "lr": 0.003})
    for _ in range(4):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        predictor = UpdatePredictor(opt)
        predicted = []
        for p, g in zip(params, grads):
            update, how = predictor(p.detach(), g)
            assert how == optimizer_kind(opt) != "generic"
            predicted.append(update)
        before = [p.detach().clone() for p in params]
        opt.step()
        for p, b, upd in zip(params, before, predicted):
            torch.testing.assert_close(p.detach() - b, upd, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_stacked_prediction_equals_the_real_update(name):
    """Three same-shaped parameters predicted at once, four steps; another group refused."""
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64)) for _ in range(4)]
    opt = OPTIMIZERS[name](params[:3])
    opt.add_param_group({"params": [params[3]], "lr": 0.003})
    for _ in range(4):
        for p in params:
            p.grad = torch.randn_like(p)
        predictor = UpdatePredictor(opt)
        theta = torch.stack([p.detach() for p in params[:3]])
        grad = torch.stack([p.grad for p in params[:3]])
        update, how = predictor.stacked(params[:3], theta, grad)
        assert how == optimizer_kind(opt)
        assert predictor.stacked(params[2:], theta[:2], grad[:2]) is None  # two groups
        before = theta.clone()
        opt.step()
        after = torch.stack([p.detach() for p in params[:3]])
        torch.testing.assert_close(after - before, update, rtol=1e-12, atol=1e-15)


def test_unknown_optimizer_and_parameter_get_the_generic_direction():
    p = torch.nn.Parameter(torch.randn(3))
    grad = torch.tensor([1.0, -2.0, 0.0])
    predictor = UpdatePredictor(torch.optim.Adagrad([p]))
    update, how = predictor(p.detach(), grad)
    assert how == "generic"
    torch.testing.assert_close(update, generic_direction(grad))
    other = torch.randn(3)  # not optimized by this optimizer
    assert UpdatePredictor(torch.optim.SGD([p], lr=1.0))(other, grad)[1] == "generic"


def test_predictor_does_not_keep_the_optimizer_alive():
    import gc
    import weakref

    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.SGD([p], lr=1.0)
    predictor = UpdatePredictor(opt)
    ref = weakref.ref(opt)
    del opt
    gc.collect()
    assert ref() is None
    assert predictor(p.detach(), torch.ones(3))[1] == "generic"


def parabola_observations(t, mu):
    f = [mu[0], mu[0] + mu[1] * t + mu[2] * t * t]
    df = [mu[1], mu[1] + 2 * mu[2] * t]
    return f, df


@pytest.mark.parametrize(
    "t, expected",
    [(1.0, 0.0), (2.0, 1.0), (0.5, -0.5), (3.0, 2.0)],
)
def test_alpha_on_an_exact_parabola(t, expected):
    """f(x) = (x - 1)^2: minimum at 1, far side at 2."""
    mu = (1.0, -2.0, 1.0)
    f, df = parabola_observations(t, mu)
    fitted = fit_quadratic(t, f, df, [0.1, 0.2], [0.3, 0.4])
    np.testing.assert_allclose(fitted, mu, atol=1e-12)
    assert normalized_step(fitted, t) == pytest.approx(expected, abs=1e-12)


def test_zero_variances_are_replaced_and_the_fit_still_works():
    f, df = parabola_observations(1.0, (1.0, -2.0, 1.0))
    assert normalized_step(fit_quadratic(1.0, f, df, [0.0, 0.0], [0.0, 0.0]), 1.0) == (
        pytest.approx(0.0, abs=1e-9)
    )


def test_weights_follow_the_variances():
    """An inconsistent observation with huge variance is ignored by the fit."""
    mu = (1.0, -2.0, 1.0)
    f, df = parabola_observations(1.5, mu)
    f[1] += 100.0
    fitted = fit_quadratic(1.5, f, df, [1e-6, 1e12], [1e-6, 1e-6])
    np.testing.assert_allclose(fitted, mu, atol=1e-6)


def test_concave_fit_and_no_step_give_minus_one():
    f, df = parabola_observations(1.0, (1.0, -1.0, -0.5))
    assert normalized_step(fit_quadratic(1.0, f, df, [1, 1], [1, 1]), 1.0) == -1.0
    assert fit_quadratic(0.0, [1.0, 1.0], [0.0, 0.0], [1, 1], [1, 1]) is None
    assert normalized_step(None, 0.0) == -1.0
    assert math.isnan(normalized_step(None, 1.0))
