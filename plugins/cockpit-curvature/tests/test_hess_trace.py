"""hess_trace against the explicit float64 Hessian and GGN; Hutchinson's estimator is unbiased."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_curvature import HessTrace

from cockpit_core.testing import run_cockpit, tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import explicit_hessian


def _block_traces(matrix: torch.Tensor, params) -> np.ndarray:
    sizes = np.cumsum([0] + [p.numel() for p in params])
    diag = torch.diagonal(matrix).numpy()
    return np.array([diag[a:b].sum() for a, b in zip(sizes[:-1], sizes[1:])])


@pytest.mark.parametrize(
    "problem", [tiny_mlp(), tiny_cnn(), tiny_mlp(loss="mse")], ids=["mlp", "cnn", "mlp-mse"]
)
def test_exact_methods_match_explicit_matrices(problem, explicit_ggn):
    quantities = [HessTrace(), HessTrace(method="diag_ggn_exact", label="ggn")]
    result = run_cockpit(problem, quantities, steps=3, on_error="raise")
    for step in range(3):
        snap, model = result.snapshots[step], result.model_at(step)
        params = list(model.parameters())
        hess = _block_traces(explicit_hessian(model, problem, snap.x, snap.y), params)
        ggn = _block_traces(explicit_ggn(model, problem, snap.x, snap.y), params)
        out = result.output[step]
        # float64 throughout: agreement to round-off; 1e-6 is the bar
        np.testing.assert_allclose(out["hess_trace"]["per_param"], hess, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(out["hess_trace"]["total"], hess.sum(), rtol=1e-6)
        np.testing.assert_allclose(out["ggn"]["per_param"], ggn, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(out["ggn"]["total"], ggn.sum(), rtol=1e-6)


def test_diag_ggn_mc_approaches_the_exact_ggn_trace(explicit_ggn):
    problem = tiny_mlp()
    torch.manual_seed(0)  # BackPACK draws the Monte-Carlo labels from torch's global RNG
    result = run_cockpit(problem, [HessTrace(method="diag_ggn_mc", mc_samples=4000)], steps=1)
    snap, model = result.snapshots[0], result.model_at(0)
    exact = torch.trace(explicit_ggn(model, problem, snap.x, snap.y)).item()
    # 4000 samples x 8 inputs: the relative standard error is well below 2%; allow 5%
    assert abs(result.output[0]["hess_trace"]["total"] - exact) < 0.05 * exact


def test_hutchinson_is_unbiased():
    problem = tiny_mlp()
    seeds = range(300)
    quantities = [HessTrace(method="hutchinson", probes=1, seed=s, label=f"h{s}") for s in seeds]
    result = run_cockpit(problem, quantities, steps=1, on_error="raise")
    snap, model = result.snapshots[0], result.model_at(0)
    params = list(model.parameters())
    exact = _block_traces(explicit_hessian(model, problem, snap.x, snap.y), params)
    samples = np.array([result.output[0][f"h{s}"]["per_param"] for s in seeds])
    mean, sem = samples.mean(0), samples.std(0, ddof=1) / np.sqrt(len(seeds))
    # each estimate is an independent unbiased sample: the mean lies within 3 standard errors
    assert np.all(np.abs(mean - exact) <= 3 * sem + 1e-12)
    totals = samples.sum(1)
    assert abs(totals.mean() - exact.sum()) <= 3 * totals.std(ddof=1) / np.sqrt(len(seeds))
    assert np.all(samples.std(0) > 0)  # really random across seeds


def test_hutchinson_is_reproducible_and_averages_its_probes():
    problem = tiny_mlp()
    quantities = [
        HessTrace(method="hutchinson", probes=4, seed=7, label="a"),
        HessTrace(method="hutchinson", probes=4, seed=7, label="b"),
        HessTrace(method="hutchinson", probes=4, seed=8, label="c"),
    ]
    result = run_cockpit(problem, quantities, steps=2)
    for step in range(2):
        out = result.output[step]
        np.testing.assert_array_equal(out["a"]["per_param"], out["b"]["per_param"])
        assert not np.allclose(out["a"]["per_param"], out["c"]["per_param"])
    assert result.output[0]["a"]["total"] != result.output[1]["a"]["total"]
