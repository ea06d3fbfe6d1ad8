"""hess_spectrum and its SLQ against the explicit float64 Hessian and its eigendecomposition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cockpit_curvature import HessSpectrum
from cockpit_curvature._slq import gauss_quadrature, lanczos_tridiagonal, probe, slq
from cockpit_curvature.spectrum_panel import INSTRUMENT

from cockpit_core import Cockpit, ConfigError, default_registry
from cockpit_core.testing import Problem, check_instrument, check_quantity, run_cockpit, tiny_mlp
from cockpit_core.testing.reference import explicit_hessian

CHEAP = {"k": 2, "slq_probes": 2, "slq_steps": 6}
"""Few products where the values are not what a test checks."""


def _hessian(result, step):
    snap = result.snapshots[step]
    return explicit_hessian(result.model_at(step), result.problem, snap.x, snap.y)


def _cdf(points, at, weights=None):
    """CDF of the discrete measure ``sum_l w_l delta(points_l)`` (uniform ``w``) at ``at``."""
    order = np.argsort(points)
    w = np.full(len(points), 1 / len(points)) if weights is None else np.asarray(weights)
    cum = np.concatenate([[0.0], np.cumsum(w[order])])
    return cum[np.searchsorted(np.asarray(points)[order], at, side="right")]


def _wasserstein(nodes, weights, eigenvalues):
    """W1 distance ``int |F_slq - F_eig| dt`` of the two discrete measures (exact)."""
    xs = np.sort(np.concatenate([nodes, eigenvalues]))
    gap = np.abs(_cdf(nodes, xs, weights) - _cdf(eigenvalues, xs))
    return float(np.sum(gap[:-1] * np.diff(xs)))


@pytest.fixture(scope="module")
def hessian():
    """The explicit float64 Hessian of the tiny MLP at its first batch (74 x 74)."""
    problem = tiny_mlp()
    x, y = problem.batch(0)
    return explicit_hessian(problem.make_model(), problem, x, y)


def test_gauss_rule_reproduces_the_moments_below_degree_2m(hessian):
    # Golub & Meurant (2010), Thm 6.2: the m-point rule is exact for degree < 2m.
    a = hessian / torch.linalg.matrix_norm(hessian, ord=2)  # moments in [-1, 1]
    gen = torch.Generator().manual_seed(0)
    for distribution in ("rademacher", "gaussian"):
        v = probe(len(a), distribution, gen)
        assert abs(float(v.norm()) - 1) < 1e-14
        alpha, beta, used = lanczos_tridiagonal(lambda u: a @ u, v, steps=8)
        nodes, weights = gauss_quadrature(alpha, beta)
        assert used == 8 and len(beta) == 7
        moments, av = [], v.clone()
        for _ in range(16):
            moments.append(float(v @ av))
            av = a @ av
        rule = [float(np.sum(weights * nodes**p)) for p in range(16)]
        # float64 Lanczos with full reorthogonalization: round-off ~1e-15 per step
        np.testing.assert_allclose(rule, moments, rtol=0, atol=1e-12)


def test_full_krylov_space_gives_the_exact_measure_of_the_probe(hessian):
    # With m >= D steps (or an earlier invariant Krylov space, e.g. repeated eigenvalues),
    # the rule is mu_v = sum_i (u_i^T v)^2 delta(lambda_i) itself.
    ev, vecs = torch.linalg.eigh(hessian)
    ev = ev.numpy()
    v = probe(len(ev), "rademacher", torch.Generator().manual_seed(1))
    alpha, beta, used = lanczos_tridiagonal(lambda u: hessian @ u, v, steps=200)
    nodes, weights = gauss_quadrature(alpha, beta)
    assert used <= len(ev)
    # compare the CDFs between eigenvalues that float64 separates clearly
    scale = float(np.abs(ev).max())
    cuts = [(lo + hi) / 2 for lo, hi in zip(ev[:-1], ev[1:]) if hi - lo > 1e-8 * scale]
    mass = ((vecs.T @ v) ** 2).numpy()
    expected = _cdf(ev, np.asarray(cuts), mass)
    np.testing.assert_allclose(_cdf(nodes, np.asarray(cuts), weights), expected, atol=1e-10)


def test_slq_with_full_krylov_spaces_matches_the_eigenvalue_cdf(hessian):
    ev = torch.linalg.eigvalsh(hessian).numpy()
    dim, probes = len(ev), 32
    quad = slq(
        lambda u: hessian @ u, dim, probes, dim, "rademacher", torch.Generator().manual_seed(2)
    )
    assert abs(quad.weights.sum() - 1) < 1e-12
    scale = float(np.abs(ev).max())
    cuts = np.asarray([(a + b) / 2 for a, b in zip(ev[:-1], ev[1:]) if b - a > 1e-8 * scale])
    ks = np.abs(_cdf(quad.nodes, cuts, quad.weights) - _cdf(ev, cuts)).max()
    # v^T P v for a Rademacher v / sqrt(D) and a rank-r projector P has mean r / D and
    # variance 2 (r - sum_j P_jj^2) / D^2 <= 1 / (2 D); averaged over n probes the standard
    # deviation is at most 1 / sqrt(2 D n) = 0.0145. Five of them: 0.073.
    assert ks <= 5 / math.sqrt(2 * dim * probes), ks  # observed: 0.032


def test_top_k_and_density_match_the_explicit_hessian():
    problem = tiny_mlp()
    result = run_cockpit(problem, [HessSpectrum()], steps=2, on_error="raise")
    for step in range(2):  # a cold and a warm start
        ev = torch.linalg.eigvalsh(_hessian(result, step)).numpy()
        out = result.output[step]["hess_spectrum"]
        assert set(out) == {
            "top",
            "nodes",
            "weights",
            "grid",
            "density",
            "sigma",
            "hvps",
            "converged",
        }
        top = ev[::-1][:5]
        assert out["converged"] and np.all(np.diff(out["top"]) <= 0)
        np.testing.assert_allclose(out["top"], top, rtol=1e-4)  # tol=1e-4 on the error bound
        # 4 probes x 20 steps (D = 74 > 20: no early stop), plus the top-k's products
        assert len(out["nodes"]) == len(out["weights"]) == 80
        assert 80 < out["hvps"] <= 80 + 100 and isinstance(out["hvps"], int)
        np.testing.assert_allclose(out["weights"].sum(), 1.0, rtol=0, atol=1e-12)
        # Ritz values lie inside the spectrum (Cauchy interlacing), up to round-off
        span = ev[-1] - ev[0]
        assert (
            ev[0] - 1e-10 * span
            <= out["nodes"].min()
            <= out["nodes"].max()
            <= ev[-1] + 1e-10 * span
        )
        # the grid spans the nodes and the top-k plus 5 kernel widths on each side
        grid, density = out["grid"], out["density"]
        assert len(grid) == len(density) == 256 and np.all(density >= 0)
        width = max(out["nodes"].max(), out["top"][0]) - out["nodes"].min()
        np.testing.assert_allclose(out["sigma"], 0.02 * width, rtol=1e-12)
        np.testing.assert_allclose(
            grid[[0, -1]] - out["nodes"].min(),
            [-5 * out["sigma"], width + 5 * out["sigma"]],
            atol=1e-12,
        )
        # trapezoid rule with spacing h <= s: below 2 exp(-2 pi^2) = 5.4e-9 per kernel on the
        # whole line; the tails beyond 5 s hold < Phi(-5) = 2.9e-7, cutting the sum there adds
        # an end correction h^2 |f'| / 12 < 6.2e-7 (h / s)^2
        assert abs(np.trapezoid(density, grid) - 1) <= 1e-6
        # W1 to the eigenvalues, relative to the range L: the m-point Gauss rule of a
        # measure on an interval of length L is within pi L / (4 m) of it in W1 (exact for
        # degree 2m - 1, Jackson's theorem: a 1-Lipschitz function is that close to such a
        # polynomial); the mean over n probes deviates by at most L / sqrt(2 D n) on
        # average (see above). Budget: that plus three times the stochastic term.
        bound = math.pi / (4 * 20) + 3 / math.sqrt(2 * len(ev) * 4)
        assert _wasserstein(out["nodes"], out["weights"], ev) <= bound * span


def test_hvp_count_and_max_iter():
    quantity = HessSpectrum(max_iter=3, tol=1e-12, warm_start=False, slq_probes=2, slq_steps=5)
    result = run_cockpit(tiny_mlp(), [quantity], steps=1, on_error="raise")
    out = result.output[0]["hess_spectrum"]
    assert out["hvps"] == 3 + 2 * 5 and out["converged"] is False
    assert len(out["nodes"]) == 10
    ev = torch.linalg.eigvalsh(_hessian(result, 0)).numpy()
    assert out["top"][0] <= ev[-1] + 1e-12  # a Ritz value, from below


def test_warm_start_from_the_cache_saves_products_on_a_slowly_changing_hessian():
    # batch_size=64 is the whole data set, Adam's steps are small: the Hessian changes little.
    # (With k = 5 on this 74-parameter model the k + 1 products of the warm block cost as
    # much as they save: docs/quantities/curvature.md.)
    problem = tiny_mlp(batch_size=64)
    cheap = {"k": 2, "slq_probes": 1, "slq_steps": 2}
    quantities = [HessSpectrum(**cheap), HessSpectrum(**cheap, warm_start=False, label="cold")]
    result = run_cockpit(problem, quantities, steps=3, optimizer="adam", on_error="raise")
    warm = [result.output[s]["hess_spectrum"]["hvps"] for s in range(1, 3)]
    cold = [result.output[s]["cold"]["hvps"] for s in range(1, 3)]
    assert sum(warm) < sum(cold), (warm, cold)  # deterministic: [6, 6] vs [7, 9]
    ev = torch.linalg.eigvalsh(_hessian(result, 2)).numpy()[::-1][:2]
    for key in ("hess_spectrum", "cold"):
        np.testing.assert_allclose(result.output[2][key]["top"], ev, rtol=1e-4)
    # k + 1 = 3 Ritz vectors wait in the cache for the next tracked step; none for "cold"
    cache = result.cockpit._tracker.cache
    assert cache.keys() == [(quantities[0].key, "eigenvectors")]
    assert cache.get(quantities[0].key, "eigenvectors").shape == (3, 74)


def _layer_norm_problem() -> Problem:
    """LayerNorm and GELU (no BackPACK second-order support), 49 parameters, float64."""

    def make() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(
            torch.nn.Linear(4, 5),
            torch.nn.LayerNorm(5),
            torch.nn.GELU(),
            torch.nn.Linear(5, 3),
        ).double()

    gen = torch.Generator().manual_seed(4)
    inputs = torch.randn(32, 4, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 3, (32,), generator=gen)
    return Problem("layer_norm", make, inputs, targets)


def test_a_cockpit_on_a_layer_norm_model():
    problem = _layer_norm_problem()
    model = problem.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(
        model.named_parameters(), [HessSpectrum(k=3, slq_probes=2, slq_steps=10)], on_error="raise"
    )
    for step in range(2):
        x, y = problem.batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward(retain_graph=cp.retain_graph(step))
        ev = torch.linalg.eigvalsh(explicit_hessian(model, problem, x, y)).numpy()
        out = cp.get_output()[step]["hess_spectrum"]
        np.testing.assert_allclose(out["top"], ev[::-1][:3], rtol=1e-4)
        assert abs(np.trapezoid(out["density"], out["grid"]) - 1) <= 1e-6
        opt.step()
    assert not cp.errors


@pytest.mark.parametrize(
    "options",
    [{}, {**CHEAP, "slq_distribution": "gaussian", "warm_start": False, "sigma": 0.1}],
    ids=["defaults", "gaussian-cold"],
)
def test_check_quantity(options):
    check_quantity(HessSpectrum, options=options)


def test_registered_by_name_and_class_name():
    registry = default_registry()
    assert registry.get("hess_spectrum") is HessSpectrum
    assert registry.get("HessSpectrum") is HessSpectrum


@pytest.mark.parametrize(
    "options, message",
    [
        ({"k": 5, "basis_size": 6}, "basis_size (6) must be at least k + 2 (7)"),
        ({"sigma": 0.001, "grid": 256}, "grid (256) must be at least 1011 for sigma=0.001"),
        ({"slq_distribution": "uniform"}, "hess_spectrum.slq_distribution"),
        ({"slq_probes": 0}, "hess_spectrum.slq_probes"),
        ({"bins": 10}, "unknown option"),
    ],
)
def test_bad_options_name_the_field_and_the_fix(options, message):
    with pytest.raises(ConfigError) as info:
        HessSpectrum(**options)
    assert message in str(info.value)


def test_panel_draws_a_run():
    check_instrument(INSTRUMENT, quantities=[HessSpectrum(**CHEAP)], steps=3)


def test_panel_draws_odd_output():
    grid = np.linspace(-1.0, 2.0, 64)
    density = np.exp(-0.5 * ((grid - 0.3) / 0.05) ** 2) / (0.05 * math.sqrt(2 * math.pi))
    good = {"top": np.array([1.5, 1.0]), "grid": grid, "density": density, "converged": True}
    output = {
        0: {"hess_spectrum": {**good, "converged": False}},
        4: {"hess_spectrum": {**good, "grid": 3 * grid, "top": np.array([4.0])}},
        5: {"hess_spectrum": {**good, "density": np.zeros(64)}},  # all below the floor
        9: {"hess_spectrum": "<unserializable: ...>"},  # skipped
    }
    check_instrument(INSTRUMENT, output=output)
    check_instrument(INSTRUMENT, output={3: output[0]})  # a single step
    fig = check_instrument(INSTRUMENT, output={3: output[9]})  # nothing to draw: a note
    assert "no eigenvalue density" in fig.axes[0].texts[0].get_text()
