"""Trace estimators with error bars (issue 18): Hutchinson, Hutch++ and XTrace.

The references are written independently of the estimators: plain float64 matrix algebra on
the explicit Hessian (``cockpit_core.testing.reference.explicit_hessian``), a fresh QR for
every leave-one-out basis of XTrace, and the same Rademacher probes (drawn column by column
from ``step_generator(seed, step)`` as the quantity does).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_curvature import HessTrace
from cockpit_curvature._common import step_generator
from cockpit_curvature._estimators import ESTIMATORS, hutchinson, hutchpp, xtrace
from cockpit_curvature.instruments import draw_trace
from matplotlib.figure import Figure

from cockpit_core import ConfigError
from cockpit_core.testing import run_cockpit, tiny_mlp
from cockpit_core.testing.reference import explicit_hessian

METHODS = ("hutchinson", "hutchpp", "xtrace")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matrices: one thread avoids oversubscribing the cores (no effect on values)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _probes(gen: torch.Generator, dim: int, count: int) -> np.ndarray:
    cols = [(torch.randint(0, 2, (dim,), generator=gen).double() * 2 - 1) for _ in range(count)]
    return torch.stack(cols, 1).numpy()


def _blocks(x: np.ndarray, sizes) -> np.ndarray:
    """Sum of the entries of each block of a vector ``x``."""
    return np.array([part.sum() for part in np.split(x, np.cumsum(sizes)[:-1])])


def _block_trace(m: np.ndarray, sizes) -> np.ndarray:
    return _blocks(np.diagonal(m), sizes)


def _summary(samples: np.ndarray, offset) -> tuple[np.ndarray, np.ndarray, float]:
    """Block estimates, their standard errors and that of the total from ``[n, blocks]``."""
    n = len(samples)
    return (
        offset + samples.mean(0),
        samples.std(0, ddof=1) / np.sqrt(n),
        samples.sum(1).std(ddof=1) / np.sqrt(n),
    )


def reference(method: str, a: np.ndarray, sizes, probes: int, gen: torch.Generator):
    """``(per_param, std_error_per_param, std_error, hvps)`` by brute force on a matrix."""
    dim = a.shape[0]
    if method == "hutchinson":
        v = _probes(gen, dim, probes)
        samples = np.array([_blocks(v[:, s] * (a @ v[:, s]), sizes) for s in range(probes)])
        return (*_summary(samples, 0.0), probes)
    if method == "hutchpp":
        k = probes // 3
        q = np.linalg.qr(a @ _probes(gen, dim, k))[0]
        exact = _block_trace(a @ q @ q.T, sizes)  # tr(D_b A Q Q^T)
        g = _probes(gen, dim, probes - 2 * k)
        p = np.eye(dim) - q @ q.T
        samples = np.array([_blocks((p @ c) * (a @ p @ c), sizes) for c in g.T])
        return (*_summary(samples, exact), probes)
    k = probes // 2
    omega = _probes(gen, dim, k)

    def term(j, drop):  # t_j with the sketch orth(A Omega) of all probes but j and `drop`
        q = np.linalg.qr(a @ np.delete(omega, sorted({j, *drop}), axis=1))[0]
        w = (np.eye(dim) - q @ q.T) @ omega[:, j]
        return _block_trace(a @ q @ q.T, sizes) + _blocks(w * (a @ w), sizes)

    samples = np.array([term(i, ()) for i in range(k)])
    per, se_per, se = _summary(samples, 0.0)
    # d[i, j] = t_j - t_(j,-i); variance std(t)^2 / k + mean_{i != j} d_ij d_ji, clipped to
    # [1, 3] times std(t)^2 / k
    d = np.array(
        [
            [samples[j] - term(j, (i,)) if i != j else 0 * samples[j] for j in range(k)]
            for i in range(k)
        ]
    )
    d = np.concatenate([d, d.sum(2, keepdims=True)], 2)
    cross = np.einsum("ijb,jib->b", d, d) / (k * (k - 1))
    heuristic = np.append(se_per, se) ** 2
    clipped = np.sqrt(np.clip(heuristic + cross, heuristic, 3 * heuristic))
    return per, clipped[:-1], clipped[-1], 2 * k


@pytest.fixture(scope="module")
def mlp_run():
    """Two steps of tiny_mlp with every randomized method, and the explicit Hessians."""
    problem = tiny_mlp()
    quantities = [HessTrace(method=m, probes=9, seed=5, label=m) for m in METHODS]
    result = run_cockpit(problem, quantities, steps=2, on_error="raise")
    hessians = []
    for step in range(2):
        snap, model = result.snapshots[step], result.model_at(step)
        sizes = [p.numel() for p in model.parameters()]
        hessians.append((explicit_hessian(model, problem, snap.x, snap.y).numpy(), sizes))
    return result, hessians


@pytest.mark.parametrize("method", METHODS)
def test_estimate_in_cockpit_equals_brute_force_on_the_explicit_hessian(method, mlp_run):
    result, hessians = mlp_run
    for step, (hess, sizes) in enumerate(hessians):
        got = result.output[step][method]
        per, se_per, se, hvps = reference(method, hess, sizes, 9, step_generator(5, step))
        # float64 on both sides, the same probes: only summation order and the QR
        # (a backward-stable map of a well-conditioned sketch here) differ, so 1e-9 is loose
        np.testing.assert_allclose(got["per_param"], per, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got["total"], per.sum(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got["std_error_per_param"], se_per, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got["std_error"], se, rtol=1e-9, atol=1e-12)
        assert got["hvps"] == hvps == (8 if method == "xtrace" else 9)
        assert np.all(se_per > 0) and se > 0


@pytest.fixture(scope="module")
def mlp_hessian():
    problem = tiny_mlp()
    result = run_cockpit(problem, [], steps=1)
    snap, model = result.snapshots[0], result.model_at(0)
    hess = explicit_hessian(model, problem, snap.x, snap.y)
    return hess, [p.numel() for p in model.parameters()]


PROBES = {"hutchinson": 12, "hutchpp": 12, "xtrace": 12}


def _check_unbiased_and_calibrated(runs, exact):
    per = np.array([r.per_param for r in runs])
    totals = per.sum(1)
    # independent seeds: the mean of the unbiased estimates is within 3 standard errors
    sem = per.std(0, ddof=1) / np.sqrt(len(runs))
    assert np.all(np.abs(per.mean(0) - exact) <= 3 * sem + 1e-12)
    assert abs(totals.mean() - exact.sum()) <= 3 * totals.std(ddof=1) / np.sqrt(len(runs))
    # E[std_error^2] = Var(estimate) for Hutchinson and (conditioning on Q, whose captured
    # part is exact) Hutch++; XTrace's adds the leave-two-out covariance term to the paper's
    # heuristic. Compare the RMS reported error with the spread; with 400-600 runs the
    # sampling error of either is 3-3.5%.
    reported = np.sqrt(np.mean([r.std_error**2 for r in runs]))
    assert reported == pytest.approx(totals.std(ddof=1), rel=0.2)
    reported_per = np.sqrt(np.mean([r.std_error_per_param**2 for r in runs], axis=0))
    np.testing.assert_allclose(reported_per, per.std(0, ddof=1), rtol=0.2)


@pytest.mark.parametrize("method", METHODS)
def test_estimators_are_unbiased_and_their_error_bars_match_the_spread(method, mlp_hessian):
    # XTrace (12 products) measured 0.93 (total) and 0.94-1.06 (blocks) of the spread; the
    # paper's std(t_i) / sqrt(k) alone 0.74 and 0.76-0.99
    hess, sizes = mlp_hessian
    runs = [
        ESTIMATORS[method](
            lambda v: hess @ v, sizes, PROBES[method], torch.Generator().manual_seed(s)
        )
        for s in range(600)
    ]
    _check_unbiased_and_calibrated(runs, _block_trace(hess.numpy(), sizes))


def test_xtrace_error_bar_matches_the_spread_on_a_low_rank_plus_diagonal_matrix():
    # A = diag(d) + V V^T, d in [1, 2], rank-4 V, 24 products: the paper's std(t_i) / sqrt(k)
    # measured 0.61 (total) and 0.63 (blocks) of the spread; with the covariance term 0.93
    # and 0.96-0.97
    dim, sizes = 40, [25, 15]
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(dim, 4, generator=gen, dtype=torch.float64) * 0.25
    a = torch.diag(1 + torch.rand(dim, generator=gen, dtype=torch.float64)) + v @ v.T
    runs = [
        xtrace(lambda x: a @ x, sizes, 24, torch.Generator().manual_seed(s)) for s in range(600)
    ]
    _check_unbiased_and_calibrated(runs, _block_trace(a.numpy(), sizes))


def test_hutchpp_needs_fewer_products_on_a_decaying_spectrum():
    # A = U diag(i^-2) U^T, D = 100: Hutchinson's error decays like 1/sqrt(m); Hutch++
    # removes the top m/3 eigenvalues exactly and is left with a tail of Frobenius norm
    # sqrt(sum_{i > m/3} i^-4), so with three times fewer products it is still more accurate
    dim = 100
    gen = torch.Generator().manual_seed(0)
    u = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))[0]
    a = u @ torch.diag(torch.arange(1, dim + 1, dtype=torch.float64) ** -2.0) @ u.T
    exact = torch.trace(a).item()

    def rmse(estimator, m):
        runs = [
            estimator(lambda v: a @ v, [dim], m, torch.Generator().manual_seed(s))
            for s in range(200)
        ]
        return np.sqrt(np.mean([(r.total - exact) ** 2 for r in runs])), runs[0].hvps

    err_h, hvps_h = rmse(hutchinson, 90)
    err_pp, hvps_pp = rmse(hutchpp, 30)
    err_x, hvps_x = rmse(xtrace, 30)
    assert (hvps_h, hvps_pp, hvps_x) == (90, 30, 30)
    # measured (200 seeds): RMSE 0.158 (Hutchinson, 90), 0.011 (Hutch++, 30), 0.0066 (XTrace, 30)
    assert err_pp < err_h / 3
    assert err_x < err_pp  # XTrace reuses every probe for sketch and correction


def test_options_are_validated():
    assert HessTrace(method="hutchpp", probes=3).config.probes == 3
    assert HessTrace(method="xtrace", probes=4, seed=2).config.seed == 2
    with pytest.raises(ConfigError, match="needs probes >= 3"):
        HessTrace(method="hutchpp", probes=2)
    with pytest.raises(ConfigError, match="needs probes >= 4"):
        HessTrace(method="xtrace", probes=3)
    with pytest.raises(ConfigError, match="seed applies only to"):
        HessTrace(method="diag_ggn_exact", seed=1)


def test_one_hutchinson_probe_has_no_error_bar():
    a = torch.eye(6, dtype=torch.float64)
    est = hutchinson(lambda v: a @ v, [2, 4], 1, torch.Generator().manual_seed(0))
    assert est.total == pytest.approx(6.0) and est.hvps == 1  # v^T I v = D for +-1 entries
    assert np.isnan(est.std_error) and np.isnan(est.std_error_per_param).all()


def test_dashboard_draws_a_two_standard_error_band():
    output = {
        s: {
            "hess_trace": {
                "total": 1.0 + s,
                "per_param": np.array([0.5, 0.5 + s]),
                "std_error": 0.25,
                "std_error_per_param": np.array([0.1, 0.2]),
            }
        }
        for s in range(3)
    }
    fig = Figure()
    ax = fig.add_subplot()
    draw_trace(ax, output, {})
    (band,) = ax.collections
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    np.testing.assert_allclose([ys.min(), ys.max()], [1.0 - 0.5, 3.0 + 0.5])
    ax = Figure().add_subplot()
    draw_trace(
        ax, {s: {"hess_trace": {"total": 1.0, "per_param": np.ones(2)}} for s in range(3)}, {}
    )
    assert not ax.collections  # exact methods: no band
