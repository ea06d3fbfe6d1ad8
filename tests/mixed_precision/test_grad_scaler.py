"""With ``info["grad_scaler"]`` every statistic is of the unscaled gradients.

Tolerance of the comparisons with the unscaled run: the GradScaler multiplies the loss by
1024 = 2**10, and cockpit divides by it again; scaling by a power of two is exact in
floating point (no overflow or underflow at these magnitudes) and the training
trajectories are identical (``scaler.step`` applies the unscaled gradient), so values
agree to rounding: rtol 1e-6 (plus atol 1e-12 for values that are 0 up to rounding).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train import BATCH, assert_same_statistics, train  # noqa: E402

from cockpit_core import CockpitWarning  # noqa: E402

RTOL, ATOL = 1e-6, 1e-12


@pytest.fixture(scope="module")
def plain():
    return {path: train("plain", path) for path in ("hooks", "backpack")}


@pytest.mark.parametrize("path", ["hooks", "backpack"])
def test_statistics_with_a_grad_scaler_equal_those_without(plain, path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)  # no mismatch or "scaled" warning
        scaled = train("scaler", path)
    assert_same_statistics(scaled, plain[path], RTOL, ATOL)


def _unscale_inside(step, model, scaler, optimizer):
    scaler.unscale_(optimizer)  # p.grad is unscaled in place before the block ends


def test_unscale_inside_the_block_is_noticed(plain):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        scaled = train("scaler", "hooks", inside=_unscale_inside)
    assert_same_statistics(scaled, plain["hooks"], RTOL, ATOL)


def _poison(step, model, scaler, optimizer):
    if step == 1:
        model[0].weight.grad[0, 0] = torch.inf


@pytest.mark.parametrize("inside", ["unscale after the block", "unscale inside the block"])
def test_a_step_whose_scaler_found_inf_is_skipped_with_the_reason(inside):
    def poison(step, model, scaler, optimizer):
        _poison(step, model, scaler, optimizer)
        if inside == "unscale inside the block":
            scaler.unscale_(optimizer)

    with pytest.warns(
        CockpitWarning,
        match=r"step 1 skipped because the GradScaler found inf/NaN gradients \(scale 1024\): it "
        r"skips this optimizer step and lowers the scale",
    ):
        cp = train("scaler", "hooks", ["loss", "grad_norm", "norm_test"], inside=poison)
    assert sorted(cp.get_output()) == [0, 2]
    (skipped,) = cp.skipped
    assert skipped["step"] == 1 and "GradScaler found inf/NaN gradients" in skipped["reason"]
    assert not cp.errors


@pytest.mark.parametrize("path", ["hooks", "backpack"])
def test_a_scaled_loss_without_the_scaler_warns(path):
    with pytest.warns(
        CockpitWarning,
        match=r"The loss was backpropagated multiplied by 1024 \(the gradient reaching "
        r"info\['loss'\] is not 1\), so every gradient is scaled \(torch.amp.GradScaler\?\)\. "
        r"Pass the scaler, info=\{'grad_scaler': scaler, \.\.\.\}",
    ):
        train("scaler", path, ["grad_norm", "norm_test"], pass_scaler=False)


def test_passing_the_scaled_loss_as_info_loss_warns():
    model = torch.nn.Linear(4, 2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    from cockpit_core import Cockpit

    cp = Cockpit(model.parameters(), ["loss", "grad_norm"])
    x, y = torch.randn(BATCH, 4), torch.randint(0, 2, (BATCH,))
    scaled = scaler.scale(torch.nn.functional.cross_entropy(model(x), y))
    with pytest.warns(CockpitWarning, match=r"info\['loss'\] looks like the scaled loss"):
        with cp(0, info={"loss": scaled, "grad_scaler": scaler}):
            scaled.backward()
    # the gradient is unscaled all the same
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm() / 1024
    assert cp.get_output()[0]["grad_norm"]["total"] == pytest.approx(float(expected), rel=1e-6)


def test_a_wrong_grad_scaler_value_is_a_clear_error():
    from cockpit_core import Cockpit, MisuseError

    cp = Cockpit(torch.nn.Linear(2, 1).parameters(), ["loss"])
    with pytest.raises(
        MisuseError, match=r"info\['grad_scaler'\] must be the torch.amp.GradScaler"
    ):
        with cp(0, info={"loss": torch.tensor(1.0), "grad_scaler": 1024.0}):
            pass


def test_hessian_diagonal_through_a_curved_activation_with_a_grad_scaler():
    """BackPACK's residual terms see the scaled gradient: H = G + (H_s - G) / s.

    The subtraction loses ~log2(s) = 10 bits of H_s's float32 precision: 1e-4 relative
    (float32 eps 6e-8 times s = 1024 is 6e-5).
    """
    quantities = ["tic_diag", "hess_trace"]
    plain = train("plain", "backpack", quantities, activation=torch.nn.Tanh)
    scaled = train("scaler", "backpack", quantities, activation=torch.nn.Tanh)
    assert_same_statistics(scaled, plain, 1e-4, ATOL)


def test_gauss_newton_diagonal_through_a_curved_activation_with_a_grad_scaler():
    quantities = [
        {"name": "hess_trace", "method": "diag_ggn_exact"},
        {"name": "tic_diag", "curvature": "diag_ggn_exact"},
    ]
    plain = train("plain", "backpack", quantities, activation=torch.nn.Tanh)
    scaled = train("scaler", "backpack", quantities, activation=torch.nn.Tanh)
    assert_same_statistics(scaled, plain, RTOL, ATOL)


class DuckScaler:
    """A scaler without PyTorch's per-optimizer state: cockpit cannot see ``unscale_``."""

    def __init__(self, scale):
        self._s = scale

    def get_scale(self):
        return self._s

    def scale(self, loss):
        return loss * self._s


def test_a_scaler_without_readable_state_is_assumed_scaled_and_says_so():
    from cockpit_core import Cockpit

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cp = Cockpit(model.parameters(), ["grad_norm"])
    x, y = torch.randn(BATCH, 4), torch.randint(0, 2, (BATCH,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler = DuckScaler(256.0)
    with pytest.warns(
        CockpitWarning,
        match=r"Cannot tell whether scaler.unscale_\(\) ran inside `with cp\(0, \.\.\.\)` "
        r"\(info\['grad_scaler'\] is a DuckScaler without PyTorch's per-optimizer state\): "
        r"cockpit assumes p.grad is still scaled",
    ):
        with cp(0, info={"loss": loss, "grad_scaler": scaler}):
            scaler.scale(loss).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert cp.get_output()[0]["grad_norm"]["total"] == pytest.approx(
        float(grads.norm() / 256), rel=1e-6
    )


def _accumulated(scaler):
    from _train import batches, make_model

    from cockpit_core import Cockpit

    model = make_model()
    loss_fn = torch.nn.CrossEntropyLoss()
    per_sample = torch.nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, ["grad_norm", "norm_test", "inner_test", "mean_gsnr"], on_error="raise")
    x, y = batches()
    for step in range(2):
        opt.zero_grad()
        info = {"batch_size": BATCH, "optimizer": opt}
        if scaler is not None:
            info["grad_scaler"] = scaler
        with cp(step, info=info, accumulate=True) as run:
            for xs, ys in zip(x[step].chunk(2), y[step].chunk(2)):  # two micro-batches of 8
                out = model(xs)
                loss = loss_fn(out, ys) / 2
                with run.micro_batch(
                    {"loss": loss, "individual_losses": per_sample(out, ys), "batch_size": 8}
                ):
                    (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
    return cp


def test_accumulated_micro_batches_with_a_grad_scaler():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        scaled = _accumulated(torch.amp.GradScaler("cpu", init_scale=1024.0))
    assert_same_statistics(scaled, _accumulated(None), RTOL, ATOL)
