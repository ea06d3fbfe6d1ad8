"""The Sharpness panel: stability thresholds and the edge-of-stability annotation."""

import math

import numpy as np
import pytest
import torch
from cockpit_curvature.sharpness_panel import SHARPNESS, draw_sharpness
from cockpit_curvature.stability import (
    EOS_FRACTION,
    edge_of_stability_spans,
    sgd_threshold,
    threshold,
)
from matplotlib.figure import Figure

from cockpit_core.testing import check_instrument


def _sgd(lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, maximize=False):
    group = dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov)
    return {
        "optimizer": "SGD",
        "groups": [dict(group, weight_decay=weight_decay, maximize=maximize)],
    }


ADAM = {"optimizer": "Adam", "groups": [{"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8}]}


@pytest.mark.parametrize(
    "hparams, expected",
    [
        (_sgd(0.1), 20.0),  # 2 / 0.1
        (_sgd(0.1, momentum=0.9), 38.0),  # (2 + 1.8) / 0.1, the demo
        (_sgd(0.05, momentum=0.9, weight_decay=1e-3), 75.999),  # 3.8 / 0.05 - 0.001
        (_sgd(0.1, momentum=0.9, dampening=0.5), 76.0),  # 3.8 / (0.1 * 0.5)
        (_sgd(0.1, momentum=0.9, nesterov=True), 3.8 / 0.28),  # 3.8 / (0.1 * 2.8)
        (_sgd(0.1, dampening=0.5), 20.0),  # dampening acts only with momentum
    ],
)
def test_sgd_threshold_hand_values(hparams, expected):
    value, formula = threshold(hparams)
    assert value == pytest.approx(expected, rel=1e-12)
    assert formula.startswith("$")


@pytest.mark.parametrize(
    "hparams, says",
    [
        (ADAM, "Adam is adaptive"),
        ({"optimizer": "AdamW", "groups": [{"lr": 1e-3}]}, "Raw Hessian shown, no threshold"),
        ({"optimizer": "LBFGS", "groups": [{"lr": 1.0}]}, "no stability threshold known"),
        (_sgd(0.1, maximize=True), "maximize"),
        ({"optimizer": "SGD", "groups": []}, "no tracked parameter"),
        (
            {"optimizer": "SGD", "groups": _sgd(0.1)["groups"] + _sgd(0.2)["groups"]},
            "different hyperparameters",
        ),
        (None, "no optimizer hyperparameters"),
    ],
)
def test_no_threshold_says_why(hparams, says):
    value, why = threshold(hparams)
    assert math.isnan(value)
    assert says in why


@pytest.mark.parametrize(
    "lr, momentum, dampening, nesterov, weight_decay",
    [
        (0.1, 0.0, 0.0, False, 0.0),
        (0.1, 0.9, 0.0, False, 0.0),
        (0.05, 0.5, 0.3, False, 1.0),
        (0.1, 0.9, 0.0, True, 0.0),
        (0.2, 0.7, 0.0, True, 0.5),
    ],
)
def test_threshold_separates_stable_from_unstable_torch_sgd(
    lr, momentum, dampening, nesterov, weight_decay
):
    # brute force: torch.optim.SGD itself on L(x) = lambda x^2 / 2 (float64), 5% on each side
    limit = sgd_threshold(lr, momentum, dampening, nesterov, weight_decay)

    def final_distance(curvature):
        x = torch.ones(1, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.SGD(
            [x], lr, momentum, dampening, weight_decay=weight_decay, nesterov=nesterov
        )
        for _ in range(300):
            opt.zero_grad()
            (0.5 * curvature * x**2).sum().backward()
            opt.step()
        return abs(float(x.detach()))

    # spectral radius of the (x, v) recurrence in these cases: <= 0.95 below, >= 1.1 above,
    # so 300 steps give ~1e-7 and ~1e12, far from the bounds
    assert final_distance(0.95 * limit) < 1e-3
    assert final_distance(1.05 * limit) > 1e3


def test_spans_need_the_stated_number_of_consecutive_steps():
    steps = np.arange(8.0)
    thr = np.full(8, 10.0)
    lam = np.array([1, 9, 9, 9, 1, 9, 9, np.nan])  # 0.9 * 10 = 9 counts as at the edge
    assert edge_of_stability_spans(steps, lam, thr) == [(1.0, 3.0, 3)]
    assert edge_of_stability_spans(steps, lam, thr, min_steps=2) == [(1.0, 3.0, 3), (5.0, 6.0, 2)]
    assert edge_of_stability_spans(steps, lam - 0.01, thr) == []


def _draw(lam, hparams_at):
    output = {
        s: {"hess_max_ev": {"value": float(v)}, "optimizer_hparams": hparams_at(s)}
        for s, v in enumerate(lam)
    }
    fig = Figure()
    ax = fig.add_subplot()
    draw_sharpness(ax, output, {})
    texts = [t.get_text() for t in ax.texts]
    return ax, texts


def test_annotation_fires_when_lambda_crosses_the_threshold():
    lam = np.linspace(5.0, 40.0, 20)  # 5 + 35 i / 19 >= 0.9 * 38 = 34.2 from i = 16 on
    ax, texts = _draw(lam, lambda s: _sgd(0.1, momentum=0.9))
    assert texts == ["EDGE OF STABILITY: steps 16-19"]
    assert len(ax.patches) == 1  # the shaded span
    np.testing.assert_allclose(ax.patches[0].get_x(), 15.5)
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    np.testing.assert_allclose(dashed[0].get_ydata(), 38.0, rtol=1e-12)
    assert "= 38" in dashed[0].get_label()


def test_no_annotation_while_lambda_stays_below():
    lam = np.linspace(5.0, 30.0, 20)
    ax, texts = _draw(lam, lambda s: _sgd(0.1, momentum=0.9))
    assert texts == [f"below the edge: max {100 * 30 / 38:.0f}% of threshold"]
    assert not ax.patches


def test_a_learning_rate_decay_ends_the_edge():
    # lambda = 35 throughout; lr 0.1 -> 0.05 at step 10 raises the threshold from 38 to 76
    _, texts = _draw(np.full(20, 35.0), lambda s: _sgd(0.1 if s < 10 else 0.05, momentum=0.9))
    assert texts == ["EDGE OF STABILITY: steps 0-9"]
    assert 35.0 < EOS_FRACTION * 76


def test_adam_shows_the_raw_hessian_and_says_so():
    ax, texts = _draw(np.linspace(1.0, 50.0, 10), lambda s: ADAM)
    assert texts[0] == "raw Hessian, no threshold"
    assert "Adam is adaptive" in texts[1].replace("\n", " ")
    assert not [line for line in ax.lines if line.get_linestyle() == "--"]


def test_panel_passes_the_instrument_check():
    # a short tiny_mlp run of hess_max_ev and optimizer_hparams, drawn live and from the log
    fig = check_instrument(SHARPNESS)
    assert fig.axes[0].get_ylabel() == r"$\lambda_{max}(H)$"
    lam = np.linspace(5.0, 40.0, 6)
    check_instrument(
        SHARPNESS,
        output={s: {"hess_max_ev": v, "optimizer_hparams": ADAM} for s, v in enumerate(lam)},
    )
