"""alpha against a brute-force float64 reference written out independently.

Reference for the value stored under step ``s``: per-sample gradients by an autograd loop
at ``theta_s`` on batch ``s`` and at ``theta_{s+1}`` on batch ``s + 1``; the update ``d``
from the parameter snapshots; slopes ``g_n . u``; the weighted least-squares parabola
solved with ``numpy.linalg.lstsq`` on the whitened system (not the normal equations the
quantity uses); ``alpha = t / x_min - 1`` with ``x_min = -mu_1 / (2 mu_2)``.

Tolerances: everything is float64; the quantity and the reference differ in summation
order and in solving the 4 x 3 least-squares problem, which costs a few digits when the
variances are very different, hence ``rel=1e-7`` on alpha (abs 1e-9 near 0).
"""

import math
import warnings

import numpy as np
import pytest
import torch
from cockpit_alpha import Alpha

from cockpit_core import Cockpit, MissingInfoError
from cockpit_core.testing import check_quantity, run_cockpit, tiny_cnn, tiny_mlp
from cockpit_core.testing import runner as runner_module
from cockpit_core.testing.reference import flat, per_sample_gradients

PROBLEMS = {"mlp": tiny_mlp, "cnn": tiny_cnn}
EXTRA_OPTIMIZERS = {
    "nesterov": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3
    ),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adam_l2_amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, amsgrad=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(
        ps, lr=0.01, momentum=0.5, centered=True, weight_decay=1e-3
    ),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05),  # no predictor: fallback
    "frozen": lambda ps: torch.optim.SGD(ps, lr=0.0),
}


@pytest.fixture(autouse=True)
def _more_optimizers(monkeypatch):
    for name, make in EXTRA_OPTIMIZERS.items():
        monkeypatch.setitem(runner_module.OPTIMIZERS, name, make)


def whitened_fit(t, f, df, var_f, var_df):
    rows = np.array([[1, 0, 0], [1, t, t**2], [0, 1, 0], [0, 1, 2 * t]], dtype=float)
    sigma = np.sqrt([v if v != 0 else 1e-10 for v in (*var_f, *var_df)])
    return np.linalg.lstsq(rows / sigma[:, None], np.array([*f, *df]) / sigma, rcond=None)[0]


def fit_in_span(d, g, theta, direction):
    """Least-squares fit of the update d in span{g, theta, direction} (SVD-based lstsq)."""
    basis = torch.stack([g.flatten(), theta.flatten(), direction.flatten()]).T
    coeff = torch.linalg.lstsq(basis, d.flatten()[:, None], driver="gelsd").solution
    return (basis @ coeff).flatten()


def reference(result, step, directions=None):
    """Brute-force alpha for the step pair (step, step + 1).

    ``directions``: the start point's per-layer third projection direction; with it the
    start slopes' variance follows the documented rule for updates outside the span.
    """
    problem, snaps = result.problem, result.snapshots
    s0, s1 = snaps[step], snaps[step + 1]
    grads0 = per_sample_gradients(result.model_at(step), problem, s0.x, s0.y)
    grads1 = per_sample_gradients(result.model_at(step + 1), problem, s1.x, s1.y)
    updates = [b - a for a, b in zip(s0.params, s0.params_after)]
    d = flat(updates)
    t = d.norm().item()
    values = {"t": t}
    for name, model_step, snap in (("f", step, s0), ("f_end", step + 1, s1)):
        with torch.no_grad():
            losses = problem.individual_losses(result.model_at(model_step)(snap.x), snap.y)
        values[name] = (losses.mean().item(), losses.var(unbiased=True).item())
    if t == 0:
        return values
    u = d / t
    slopes0 = flat(grads0, start_dim=1) @ u
    slopes1 = flat(grads1, start_dim=1) @ u
    var0 = slopes0.var(unbiased=True).item()
    exact = True
    if directions is not None:  # the documented rule: exact in the span, diagonal outside
        in_span = torch.zeros(len(slopes0), dtype=torch.float64)
        diagonal = 0.0
        for i, (g, upd) in enumerate(zip(grads0, updates)):
            if upd.norm() == 0:
                continue
            fitted = fit_in_span(upd, g.mean(0), s0.params[i], directions[i])
            in_span += g.flatten(1) @ fitted
            rest = upd.flatten() - fitted
            rounding = torch.finfo(upd.dtype).eps * s0.params_after[i].norm()
            if rest.norm() > 1e-6 * upd.norm() + rounding:  # span_rtol
                exact = False
                diagonal += (rest**2 * g.flatten(1).var(0, unbiased=True)).sum().item()
        var0 = in_span.var(unbiased=True).item() / t**2 + diagonal / t**2
    values["df"] = (slopes0.mean().item(), slopes1.mean().item())
    values["var_df"] = (var0, slopes1.var(unbiased=True).item())
    values["exact"] = exact
    mu = whitened_fit(t, (values["f"][0], values["f_end"][0]), values["df"],
                      (values["f"][1], values["f_end"][1]), values["var_df"])  # fmt: skip
    values["alpha"] = -1.0 if mu[2] <= 0 else t / (-mu[1] / (2 * mu[2])) - 1
    return values


def assert_matches(got, ref, rel=1e-8):
    assert got["step_length"] == pytest.approx(ref["t"], rel=1e-12)
    assert got["f"] == pytest.approx([ref["f"][0], ref["f_end"][0]], rel=1e-12)
    assert got["var_f"] == pytest.approx([ref["f"][1], ref["f_end"][1]], rel=1e-10)
    assert got["df"] == pytest.approx(ref["df"], rel=1e-9, abs=1e-14)
    assert got["var_df"] == pytest.approx(ref["var_df"], rel=rel)
    assert got["alpha"] == pytest.approx(ref["alpha"], rel=10 * rel, abs=1e-9)


def test_protocol():
    check_quantity(Alpha)
    check_quantity(Alpha, options={"span_rtol": 1e-6}, problem=tiny_cnn())


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "sgd_momentum"])
@pytest.mark.parametrize("problem", ["mlp", "cnn"])
def test_alpha_equals_brute_force(problem, optimizer):
    result = run_cockpit(PROBLEMS[problem](), [Alpha()], steps=4, optimizer=optimizer)
    assert sorted(result.output) == [0, 1, 2]  # stored under the start step
    for step in range(3):
        got = result.output[step]["alpha"]
        assert got["exact"] is True
        assert_matches(got, reference(result, step))
    expected_predictor = {"sgd": "sgd", "adam": "adam", "sgd_momentum": "sgd"}[optimizer]
    assert result.output[0]["alpha"]["predictor"] == "generic"  # optimizer not seen yet
    assert result.output[1]["alpha"]["predictor"] == expected_predictor


def run_with_directions(problem, optimizer, steps=4):
    """Run alpha and record each start point's third basis vector (for the fallback rule)."""
    q = Alpha()
    directions = {}
    original = q.compute_start

    def spy(ctx):
        state = original(ctx)
        directions[ctx.step] = [t.clone() for t in state.to_dict()["direction"]]
        return state

    q.compute_start = spy
    return run_cockpit(problem, [q], steps=steps, optimizer=optimizer), directions


@pytest.mark.parametrize("optimizer", ["nesterov", "adamw", "adam_l2_amsgrad", "rmsprop"])
def test_other_optimizers_are_exact_once_the_optimizer_is_known(optimizer):
    result, directions = run_with_directions(tiny_mlp(), optimizer)
    for step in range(3):
        got = result.output[step]["alpha"]
        ref = reference(result, step, directions=directions[step])
        assert got["exact"] == ref["exact"]
        if step >= 1:  # info['optimizer'] was seen at step 0: the update is predicted
            assert got["exact"] is True and got["predictor"] != "generic"
        assert_matches(got, ref)


def test_unknown_optimizer_falls_back_to_the_diagonal_approximation():
    result, directions = run_with_directions(tiny_mlp(), "adagrad")
    inexact = 0
    for step in range(3):
        got = result.output[step]["alpha"]
        assert got["predictor"] == "generic"
        ref = reference(result, step, directions=directions[step])
        assert got["exact"] == ref["exact"]
        inexact += not got["exact"]
        assert_matches(got, ref)
    assert inexact >= 2  # Adagrad's accumulated state leaves the span after its first step


def test_no_update_gives_minus_one():
    result = run_cockpit(tiny_mlp(), [Alpha()], steps=2, optimizer="frozen")
    got = result.output[0]["alpha"]
    assert got["alpha"] == -1.0 and got["step_length"] == 0.0
    assert math.isnan(got["df"][0])


def test_memory_is_order_d_not_b_times_d():
    q = Alpha(schedule=lambda s: s == 0)
    problem = tiny_cnn(batch_size=12)
    result = run_cockpit(problem, [q], steps=1, optimizer="adam")  # start kept, no end yet
    state = q._live()
    n_params = sum(p.numel() for p in result.model.parameters())
    n_layers = len(list(result.model.parameters()))
    assert state.nbytes == 8 * (4 * n_params + 3 * 12 * n_layers)  # float64
    assert state.nbytes < 8 * 12 * n_params  # less than one B x D copy


def test_model_returned_losses_without_an_extended_loss_module():
    """Per-sample losses from the model, a plain mean, no info['loss']: same values."""
    problem = tiny_mlp()
    expected = run_cockpit(problem, [Alpha()], steps=3, optimizer="adam").output
    model = problem.make_model()  # extended model; the loss is never extended
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    cp = Cockpit(model.named_parameters(), [Alpha()], on_error="raise")
    for step in range(3):
        x, y = problem.batch(step)
        opt.zero_grad()
        losses = problem.individual_losses(model(x), y)
        with cp(step, info={"individual_losses": losses, "optimizer": opt}):
            losses.mean().backward()
        opt.step()
    for step, values in cp.get_output().items():
        got, ref = values["alpha"], expected[step]["alpha"]
        assert got["alpha"] == pytest.approx(ref["alpha"], rel=1e-10)
        assert got["var_df"] == pytest.approx(ref["var_df"], rel=1e-10)


def test_missing_individual_losses_is_reported_when_the_step_begins():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), [Alpha()])
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with pytest.raises(MissingInfoError, match="'alpha' needs info\\['individual_losses'\\]"):
        with cp(0, info={"loss": loss, "batch_size": len(x)}):
            loss.backward()


def test_batch_of_one_is_an_error_that_says_why():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_cockpit(tiny_mlp(batch_size=1), [Alpha()], steps=2)
    assert result.output == {}
    assert any("at least 2 samples" in e["error"] for e in result.cockpit.errors)


def test_wrong_number_of_losses_is_an_error_that_says_what_to_pass():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_cockpit(
            tiny_mlp(), [Alpha()], steps=2, info_extra={"individual_losses": torch.ones(3)}
        )
    assert any("per-sample losses of this mini-batch" in e["error"] for e in result.cockpit.errors)


def test_a_failing_projection_is_reported_without_breaking_backward(monkeypatch):
    import cockpit_alpha.alpha as module

    def broken(*args, **kwargs):
        raise RuntimeError("prediction exploded")

    monkeypatch.setattr(module, "generic_direction", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_cockpit(tiny_mlp(), [Alpha()], steps=3)  # backward must not raise
    assert 0 not in result.output
    assert "prediction exploded" in result.cockpit.errors[0]["error"]


def test_sharing_the_backward_pass_with_other_quantities_changes_nothing():
    """alpha next to the histograms (one per-sample pass per layer) equals alpha alone."""
    histograms = pytest.importorskip("cockpit_histograms")
    together = run_cockpit(
        tiny_cnn(),
        [Alpha(), histograms.GradHist1d(), histograms.GradHist2d()],
        steps=6,
        optimizer="adam",
    ).output
    alone = run_cockpit(tiny_cnn(), [Alpha()], steps=6, optimizer="adam").output
    assert sorted(alone) == list(range(5))
    for step, values in alone.items():
        assert together[step]["alpha"] == values["alpha"]
