"""TIC against a brute force from per-sample gradients (autograd loop) and explicit curvature."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_curvature import TICDiag, TICTrace

from cockpit_core.testing import run_cockpit, tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import explicit_hessian, per_sample_gradients


def _brute_force(moment, curvature, sizes, eps, negative="keep"):
    """TIC_diag, TIC_trace and their per-parameter parts from flat float64 vectors."""
    if negative == "abs":
        curvature = np.abs(curvature)
    keep = curvature >= 0 if negative == "exclude" else np.ones_like(curvature, dtype=bool)
    bounds = np.cumsum([0] + sizes)
    diag_parts, trace_parts = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        m, h = moment[a:b][keep[a:b]], curvature[a:b][keep[a:b]]
        diag_parts.append((m / (h + eps)).sum())
        trace_parts.append(m.sum() / (h.sum() + eps))
    m, h = moment[keep], curvature[keep]
    return (
        (m / (h + eps)).sum(),
        np.array(diag_parts),
        m.sum() / (h.sum() + eps),
        np.array(trace_parts),
    )


def _reference(result, step, curvature_of, negative="keep", eps=1e-7):
    snap, model = result.snapshots[step], result.model_at(step)
    problem = result.problem
    grads = per_sample_gradients(model, problem, snap.x, snap.y)
    # uncentred second moment (1/B) sum_n g_n^2, as Cockpit 1.0.2
    moment = torch.cat([(g**2).mean(0).flatten() for g in grads]).numpy()
    curvature = curvature_of(model, problem, snap.x, snap.y)
    sizes = [p.numel() for p in model.parameters()]
    return _brute_force(moment, curvature, sizes, eps, negative)


def _hessian_diagonal(model, problem, x, y):
    return torch.diagonal(explicit_hessian(model, problem, x, y)).numpy()


@pytest.mark.parametrize("problem", [tiny_mlp(), tiny_cnn()], ids=lambda p: p.name)
def test_defaults_match_the_brute_force_with_the_hessian_diagonal(problem):
    result = run_cockpit(problem, [TICDiag(), TICTrace()], steps=3, on_error="raise")
    for step in range(3):
        diag, diag_parts, trace, trace_parts = _reference(result, step, _hessian_diagonal)
        out = result.output[step]
        # float64: the only differences are summation order; eps=1e-7 can amplify round-off
        # of entries with h ~ -eps, hence rtol 1e-6 rather than machine precision
        np.testing.assert_allclose(out["tic_diag"]["total"], diag, rtol=1e-6)
        np.testing.assert_allclose(out["tic_diag"]["per_param"], diag_parts, rtol=1e-6)
        np.testing.assert_allclose(out["tic_trace"]["total"], trace, rtol=1e-6)
        np.testing.assert_allclose(out["tic_trace"]["per_param"], trace_parts, rtol=1e-6)


def test_ggn_curvature_matches_the_brute_force(explicit_ggn):
    problem = tiny_mlp()
    quantities = [
        TICDiag(curvature="diag_ggn_exact", epsilon=1e-3),
        TICTrace(curvature="diag_ggn_exact", epsilon=1e-3),
    ]
    result = run_cockpit(problem, quantities, steps=2, on_error="raise")

    def ggn_diagonal(model, problem, x, y):
        return torch.diagonal(explicit_ggn(model, problem, x, y)).numpy()

    for step in range(2):
        diag, diag_parts, trace, _ = _reference(result, step, ggn_diagonal, eps=1e-3)
        np.testing.assert_allclose(result.output[step]["tic_diag"]["total"], diag, rtol=1e-8)
        np.testing.assert_allclose(
            result.output[step]["tic_diag"]["per_param"], diag_parts, rtol=1e-8
        )
        np.testing.assert_allclose(result.output[step]["tic_trace"]["total"], trace, rtol=1e-8)


@pytest.mark.parametrize("negative", ["abs", "exclude"])
def test_negative_curvature_guards(negative):
    problem = tiny_mlp()
    quantities = [
        TICDiag(negative_curvature=negative, label="diag"),
        TICTrace(negative_curvature=negative, label="trace"),
        TICDiag(label="raw"),
    ]
    result = run_cockpit(problem, quantities, steps=2, on_error="raise")
    negatives = 0
    for step in range(2):
        hdiag = _hessian_diagonal(
            result.model_at(step), problem, result.snapshots[step].x, result.snapshots[step].y
        )
        negatives += int((hdiag < 0).sum())
        diag, _, trace, trace_parts = _reference(result, step, _hessian_diagonal, negative)
        out = result.output[step]
        np.testing.assert_allclose(out["diag"]["total"], diag, rtol=1e-6)
        np.testing.assert_allclose(out["trace"]["total"], trace, rtol=1e-6)
        np.testing.assert_allclose(out["trace"]["per_param"], trace_parts, rtol=1e-6)
        assert out["diag"]["total"] >= 0
    assert negatives > 0  # the tanh network really has negative Hessian-diagonal entries


def test_diag_ggn_mc_curvature_runs_and_is_positive():
    result = run_cockpit(tiny_mlp(), [TICDiag(curvature="diag_ggn_mc", mc_samples=2)], steps=2)
    assert all(result.output[s]["tic_diag"]["total"] > 0 for s in range(2))
    assert not result.cockpit.errors
