"""The thick-restart Lanczos solver against dense symmetric eigendecompositions (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_curvature._lanczos import lanczos


def _matrix(eigenvalues: np.ndarray, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((len(eigenvalues), len(eigenvalues))))
    return torch.tensor(q @ np.diag(eigenvalues) @ q.T)


def _wanted(eigenvalues: np.ndarray, k: int, which: str) -> np.ndarray:
    key = eigenvalues if which == "largest_algebraic" else np.abs(eigenvalues)
    return eigenvalues[np.argsort(-key)[:k]]


SPECTRA = {
    "separated": np.concatenate([np.linspace(-0.3, 0.3, 197), [0.6, 0.8, 1.0]]),
    # negative eigenvalue of largest magnitude: largest_algebraic and _magnitude differ
    "negative_dominant": np.concatenate([np.linspace(-0.2, 0.5, 198), [0.7, -1.0]]),
    # many eigenvalues close to the top one: needs thick restarts with basis_size=10
    "clustered": np.concatenate([np.linspace(0.0, 0.9, 190), 1.0 - 0.01 * np.arange(10)]),
}


@pytest.mark.parametrize("spectrum", SPECTRA, ids=str)
@pytest.mark.parametrize("which", ["largest_algebraic", "largest_magnitude"])
@pytest.mark.parametrize("k", [1, 3])
def test_wanted_eigenpairs_match_the_dense_solver(spectrum, which, k):
    eigenvalues = SPECTRA[spectrum]
    a = _matrix(eigenvalues)
    start = torch.randn(len(eigenvalues), generator=torch.Generator().manual_seed(1))
    res = lanczos(
        lambda v: a @ v, start.double(), k=k, which=which, tol=1e-10, max_iter=400, basis_size=10
    )
    assert res.converged
    # tol=1e-10 relative on the error bound; 1e-9 leaves room for the bound being an estimate
    np.testing.assert_allclose(res.eigenvalues, _wanted(eigenvalues, k, which), rtol=1e-9)
    residual = a @ res.eigenvectors.T - res.eigenvectors.T * torch.tensor(res.eigenvalues)
    assert residual.norm(dim=0).max() < 1e-4  # eigenvector error ~ sqrt(eigenvalue error)
    assert np.all(res.error_bounds <= 1e-10 * np.abs(res.eigenvalues))


def test_the_error_bound_holds_when_the_tolerance_is_met():
    eigenvalues = SPECTRA["separated"]
    a = _matrix(eigenvalues, seed=3)
    start = torch.randn(len(eigenvalues), generator=torch.Generator().manual_seed(2)).double()
    for tol in (1e-2, 1e-4, 1e-6):
        res = lanczos(lambda v: a @ v, start, tol=tol)
        assert res.converged
        assert abs(res.eigenvalues[0] - 1.0) <= tol


def test_max_iter_stops_and_reports_no_convergence():
    a = _matrix(SPECTRA["clustered"])
    res = lanczos(lambda v: a @ v, torch.ones(200, dtype=torch.float64), tol=1e-12, max_iter=5)
    assert res.matvecs == 5 and not res.converged
    assert res.eigenvalues[0] <= 1.0 + 1e-12  # a Ritz value never exceeds the top eigenvalue


def test_an_exact_eigenvector_converges_after_one_product():
    a = _matrix(SPECTRA["separated"])
    top = torch.linalg.eigh(a).eigenvectors[:, -1]
    res = lanczos(lambda v: a @ v, top, tol=1e-8)
    assert res.matvecs == 1 and res.converged
    assert abs(res.eigenvalues[0] - 1.0) < 1e-12


def test_low_rank_operator_continues_after_an_invariant_subspace():
    # rank-2 operator: the Krylov space of a vector in its range is exhausted after 2 steps
    u = torch.linalg.qr(torch.randn(50, 3, generator=torch.Generator().manual_seed(0)).double())[0]
    a = u @ torch.diag(torch.tensor([2.0, -3.0, 0.0], dtype=torch.float64)) @ u.T
    res = lanczos(
        lambda v: a @ v,
        u[:, 0] + u[:, 1],
        k=2,
        which="largest_magnitude",
        tol=1e-10,
        generator=torch.Generator().manual_seed(0),
    )
    np.testing.assert_allclose(res.eigenvalues, [-3.0, 2.0], atol=1e-10)


@pytest.mark.parametrize("dim", [1, 2, 4])
def test_tiny_dimensions(dim):
    eigenvalues = np.arange(1.0, dim + 1)
    a = _matrix(eigenvalues)
    res = lanczos(lambda v: a @ v, torch.ones(dim, dtype=torch.float64), k=3, tol=1e-12)
    np.testing.assert_allclose(res.eigenvalues, eigenvalues[::-1][:3], rtol=1e-12)
    assert res.matvecs <= dim


def test_float32_operator_reaches_float32_accuracy():
    eigenvalues = SPECTRA["separated"]
    a = _matrix(eigenvalues).float()
    start = torch.randn(200, generator=torch.Generator().manual_seed(0))
    res = lanczos(lambda v: a @ v, start, tol=1e-5)
    assert res.eigenvectors.dtype == torch.float32
    assert abs(res.eigenvalues[0] - 1.0) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_gram_rows_accumulated_over_column_chunks_give_the_same_result(monkeypatch, dtype):
    """Large models extend the float64 Gram matrices chunk by chunk (here 29, the last
    uneven); only the summation order differs from one chunk, so results agree to
    float64 rounding."""
    from cockpit_curvature import _lanczos

    eigenvalues = SPECTRA["separated"]
    a = _matrix(eigenvalues).to(dtype)
    start = torch.randn(200, generator=torch.Generator().manual_seed(0)).to(dtype)
    whole = lanczos(lambda v: a @ v, start, k=3, tol=1e-6)
    monkeypatch.setattr(_lanczos, "GRAM_CHUNK", 7)
    chunked = lanczos(lambda v: a @ v, start, k=3, tol=1e-6)
    assert chunked.converged and chunked.matvecs == whole.matvecs
    np.testing.assert_allclose(chunked.eigenvalues, whole.eigenvalues, rtol=1e-12)
    np.testing.assert_allclose(chunked.eigenvalues, [1.0, 0.8, 0.6], rtol=1e-5)


def test_zero_start_vector_and_bad_which_are_rejected():
    a = torch.eye(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="must not be zero"):
        lanczos(lambda v: a @ v, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="which must be one of"):
        lanczos(lambda v: a @ v, torch.ones(3, dtype=torch.float64), which="smallest")


def test_non_finite_products_raise_a_clear_error():
    with pytest.raises(FloatingPointError, match="not finite"):
        lanczos(lambda v: v * float("nan"), torch.ones(3, dtype=torch.float64))


def test_a_block_of_exact_eigenvectors_converges_after_its_own_products():
    a = _matrix(SPECTRA["separated"])
    vectors = torch.linalg.eigh(a).eigenvectors
    block = torch.stack([vectors[:, -1], vectors[:, -2]])
    res = lanczos(lambda v: a @ v, block, tol=1e-8, gap="ritz")
    assert res.matvecs == 2 and res.converged
    assert abs(res.eigenvalues[0] - 1.0) < 1e-12
    assert (
        res.next_vector is not None and abs(float(res.next_vector[0] @ vectors[:, -2])) > 1 - 1e-10
    )


def test_warm_block_on_a_drifting_operator_is_accurate_and_cheaper_than_a_cold_start():
    # a sequence of operators whose leading eigenvectors rotate a little from one to the
    # next (like mini-batch Hessians): the warm block with gap="ritz" must still meet tol
    rng = np.random.default_rng(3)
    base = _matrix(SPECTRA["separated"]).numpy()
    warm_start, warm, cold = None, [], []
    for step in range(8):
        noise = rng.standard_normal(base.shape)
        a = torch.tensor(base + 0.01 * (noise + noise.T))
        exact = float(torch.linalg.eigvalsh(a)[-1])
        start = torch.randn(200, generator=torch.Generator().manual_seed(step), dtype=torch.float64)

        def matvec(v, a=a):
            return a @ v

        res_cold = lanczos(matvec, start, tol=1e-4)
        res = res_cold if warm_start is None else lanczos(matvec, warm_start, gap="ritz")
        assert abs(res.eigenvalues[0] - exact) <= 1e-4 * abs(exact)
        assert abs(res_cold.eigenvalues[0] - exact) <= 1e-4 * abs(exact)
        if warm_start is not None:
            warm.append(res.matvecs)
            cold.append(res_cold.matvecs)
        warm_start = torch.cat([res.eigenvectors, res.next_vector])
    assert sum(warm) < sum(cold), (warm, cold)


def test_dependent_start_vectors_are_skipped_and_unknown_gap_rejected():
    a = _matrix(SPECTRA["separated"])
    top = torch.linalg.eigh(a).eigenvectors[:, -1]
    res = lanczos(lambda v: a @ v, torch.stack([top, 2 * top, torch.zeros(200).double()]), tol=1e-8)
    assert res.matvecs == 1 and abs(res.eigenvalues[0] - 1.0) < 1e-12
    with pytest.raises(ValueError, match="gap must be one of"):
        lanczos(lambda v: a @ v, top, gap="guess")


@pytest.mark.parametrize("following", [0, 1, 3])
def test_following_ritz_vectors_are_returned_for_a_larger_warm_block(following):
    eigenvalues = SPECTRA["separated"]
    a = _matrix(eigenvalues, seed=4)
    start = torch.randn(len(eigenvalues), generator=torch.Generator().manual_seed(5)).double()
    res = lanczos(lambda v: a @ v, start, tol=1e-12, max_iter=200, following=following)
    if following == 0:
        assert res.next_vector is None
        return
    vectors = res.next_vector
    assert vectors.shape == (following, len(eigenvalues))
    np.testing.assert_allclose(vectors.norm(dim=1), 1.0, rtol=1e-12)
    # the Ritz vectors after the top one, in order: Rayleigh quotients decrease, and they are
    # orthogonal to the top eigenvector and to each other (one Ritz basis)
    block = torch.cat([res.eigenvectors, vectors])
    np.testing.assert_allclose(block @ block.T, np.eye(following + 1), atol=1e-10)
    quotients = torch.einsum("id,de,ie->i", vectors, a, vectors).numpy()
    assert np.all(np.diff(quotients) < 0) and quotients[0] <= res.eigenvalues[0]
    # the second one is converged as well (0.8 is well separated from the bulk)
    assert quotients[0] == pytest.approx(0.8, rel=1e-6)
