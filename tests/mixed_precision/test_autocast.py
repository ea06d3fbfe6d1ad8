"""Autocast: statistics of a float32 model whose activations are bfloat16 or float16.

Tolerances against the float32 run: bfloat16 keeps 8 significant bits, so every
activation and output gradient carries a relative rounding of up to 2**-8 (0.4%); through
two layers, the loss and three training steps this reaches about 2% in the loss, gradient
norms, update sizes and the top Hessian eigenvalue (rtol 0.05). The gradient tests and
alpha are ratios of sample variances of 16 samples, which amplify it (up to ~5% measured;
rtol 0.15). Histograms: counts move between neighbouring bins, so the total must agree
and at most 5% of the counts may move. Curvature diagonals: besides the rounding, a
first-layer pre-activation within rounding of zero (0.0009 at step 0) changes sign, so
its ReLU passes another set of samples; this moves the first layer's Hessian trace by 5%
(measured; rtol 0.1). float16 keeps 11 significant bits (rounding up to 2**-11, 8 times
less): each tolerance is bfloat16's divided by 5 (measured at most 0.15%).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train import QUANTITIES, STEPS, assert_same_statistics, flatten, train  # noqa: E402

from cockpit_core import Cockpit  # noqa: E402
from cockpit_core.engine import loop_checks  # noqa: E402

CURVATURE = ["tic_diag", "hess_trace"]
FIRST_ORDER = [q for q in QUANTITIES if q not in CURVATURE]
RATIOS = ("alpha", "inner_test", "norm_test", "ortho_test")
# rtol: of most values, of the ratios, of the curvature diagonals; histogram counts moved
BF16 = {"rtol": 0.05, "ratios": 0.15, "curvature": 0.1, "moved": 0.05}
TOLERANCES = {"bf16": BF16, "fp16": {key: value / 5 for key, value in BF16.items()}}


def train_autocast(precision: str, path: str, quantities: list[str]) -> Cockpit:
    """:func:`_train.train` with its forward passes under autocast to ``precision``.

    The run must not warn that ``p.grad`` is not the mean of the per-sample gradients:
    that check allows for the rounding of ``precision``.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cp = train(precision, path, quantities)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "is not the mean of its per-sample gradients" in m]
    return cp


def _compare_histograms(half: Cockpit, fp32: Cockpit, moved: float) -> None:
    out, ref = (
        half._tracker.output,
        fp32._tracker.output,
    )  # compared here, then left out of the rest
    for step in ref:
        got, want = flatten(out[step].pop("grad_hist_1d")), flatten(ref[step].pop("grad_hist_1d"))
        counts, expected = np.asarray(got["hist"]), np.asarray(want["hist"])
        assert counts.sum() == expected.sum()
        assert np.abs(counts - expected).sum() <= moved * expected.sum()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("path", ["hooks", "backpack"])
def test_autocast_gives_the_float32_statistics(path, precision):
    fp32 = train("plain", path, FIRST_ORDER)
    half = train_autocast(precision, path, FIRST_ORDER)
    tol = TOLERANCES[precision]
    _compare_histograms(half, fp32, tol["moved"])
    for cp in (half, fp32):  # alpha's "exact" flag depends on rounding, not on the value
        for values in cp._tracker.output.values():
            if "alpha" in values:
                values["alpha"].pop("exact")
    ratios = {q: (tol["ratios"], 1e-3) for q in RATIOS}
    assert_same_statistics(half, fp32, rtol=tol["rtol"], atol=1e-6, tolerances=ratios)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_curvature_diagonals_under_autocast_are_the_float32_ones(precision):
    """BackPACK's DiagHessian runs in float32 on the half-precision inputs it saved."""
    fp32 = train("plain", "backpack", CURVATURE)
    half = train_autocast(precision, "backpack", CURVATURE)
    expected = fp32.get_output()
    assert sorted(expected) == list(range(STEPS))  # every step and quantity is compared
    assert all(set(values) == set(CURVATURE) for values in expected.values())
    assert_same_statistics(half, fp32, rtol=TOLERANCES[precision]["curvature"])


def test_the_per_sample_mean_check_allows_for_the_precision_of_p_grad():
    grad = torch.randn(3, generator=torch.Generator().manual_seed(0))
    assert loop_checks.gradient_precision(grad) == torch.float32
    assert loop_checks.gradient_precision(grad.bfloat16().float()) == torch.bfloat16
    assert loop_checks.gradient_precision(grad.half().float()) == torch.float16
    # 0.5% off: bfloat16 rounding (tolerance 2**-6), but not float16's (2**-9) or float32's
    assert loop_checks.per_sample_mismatch("2.bias", 1.005, 1e-3, 16, torch.bfloat16) is None
    for dtype in (torch.float16, torch.float32):
        message = loop_checks.per_sample_mismatch("2.bias", 1.005, 1e-3, 16, dtype)
        assert message.startswith(
            "the gradient of '2.bias' is not the mean of its per-sample gradients (p.grad ~ "
            "1.005 x their mean, residual 0.001)"
        )
