"""Thick-restart Lanczos for extreme eigenpairs of a symmetric operator given by matvecs.

Lanczos (1950) with full reorthogonalization and thick restarts (Wu & Simon, 2000,
"Thick-restart Lanczos method for large symmetric eigenvalue problems"). The basis ``V``
(rows, orthonormal) satisfies ``A V^T = V^T T + r b^T``: ``T = V A V^T`` is the projected
matrix and ``r`` the residual direction. A Ritz pair ``(theta, V^T s)`` of ``T`` then has
residual norm ``||A x - theta x|| = ||r|| |b^T s|``, available without another product.

Stopping rule: the eigenvalue error of a Ritz value is at most its residual ``rho``, and at
most ``rho^2 / delta`` when the rest of the spectrum is at distance ``delta``
(Kato-Temple inequality; see Parlett, 1998, "The Symmetric Eigenvalue Problem").
``delta`` is estimated from the nearest other Ritz value once that one has converged
(:func:`_error_bounds`). The iteration stops when ``min(rho, rho^2 / delta) <= tol *
|theta|`` for every wanted pair. Like every Krylov method it can miss an eigenvalue whose
eigenvector is (nearly) orthogonal to the start vector; a random start makes that unlikely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

WHICH = ("largest_algebraic", "largest_magnitude")
GAP_TRUST = 0.1
"""A neighbouring Ritz value counts as converged once its residual is this fraction of the gap."""
ZERO = 1e-6
"""Eigenvalues below ``ZERO`` times the largest Ritz magnitude are measured against the latter."""


@dataclass
class LanczosResult:
    """Wanted Ritz pairs, ordered from the most wanted (largest value or magnitude).

    Attributes:
        eigenvalues: ``[k]`` Ritz values (float64).
        eigenvectors: ``[k, D]`` unit Ritz vectors (dtype and device of the start vector).
        error_bounds: ``[k]`` estimated absolute eigenvalue errors.
        matvecs: Number of operator applications.
        converged: Whether every wanted pair met the tolerance.

    """

    eigenvalues: np.ndarray
    eigenvectors: Tensor
    error_bounds: np.ndarray
    matvecs: int
    converged: bool


def _wanted(theta: np.ndarray, k: int, which: str) -> np.ndarray:
    """Indices of the ``k`` most wanted Ritz values, most wanted first."""
    key = theta if which == "largest_algebraic" else np.abs(theta)
    return np.argsort(-key, kind="stable")[:k]


def _error_bounds(theta: np.ndarray, res: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Estimated eigenvalue errors ``min(rho_i, rho_i^2 / delta_i)`` of the Ritz values ``idx``.

    ``rho_i`` alone bounds the distance of ``theta_i`` to the nearest eigenvalue. The gap
    ``delta_i`` to the rest of the spectrum is only trusted once the nearest other Ritz value
    ``theta_j`` has converged (``rho_j <= GAP_TRUST * |theta_i - theta_j|``) and no Ritz value
    could hide an eigenvalue next to ``theta_i``; then ``delta_i = |theta_i - theta_j| - rho_j``.
    Before, an eigenvalue the Krylov space has not found yet may sit in between.
    """
    bounds = res[idx].astype(np.float64)
    for n, i in enumerate(idx):
        others = np.delete(np.arange(len(theta)), i)
        if len(others) == 0:
            continue
        dist = np.abs(theta[others] - theta[i])
        near = int(np.argmin(dist))
        if res[others][near] <= GAP_TRUST * dist[near] and np.all(dist > res[others]):
            gap = dist[near] - res[others][near]
            bounds[n] = min(res[i], res[i] ** 2 / gap)
    return bounds


def lanczos(
    matvec: Callable[[Tensor], Tensor],
    start: Tensor,
    k: int = 1,
    which: str = "largest_algebraic",
    tol: float = 1e-4,
    max_iter: int = 100,
    basis_size: int = 20,
    generator: torch.Generator | None = None,
) -> LanczosResult:
    """Compute the ``k`` wanted eigenpairs of the symmetric operator ``matvec``.

    Args:
        matvec: ``v -> A v`` for flat vectors of the shape of ``start``.
        start: Start vector (any non-zero vector; a previous eigenvector warm-starts).
        k: Number of wanted eigenpairs.
        which: ``"largest_algebraic"`` or ``"largest_magnitude"``.
        tol: Relative tolerance on the estimated eigenvalue error (relative to ``|theta|``, or
            to ``ZERO`` times the largest Ritz magnitude for eigenvalues near zero).
        max_iter: Maximum number of matvecs.
        basis_size: Basis vectors kept before a thick restart (memory: that many vectors).
        generator: Random numbers for a new direction after an invariant subspace is found.

    Returns:
        The wanted Ritz pairs and convergence information.

    """
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}.")
    dim = start.numel()
    k = min(k, dim)
    basis_size = max(min(basis_size, dim), min(k + 2, dim))
    dtype, device = start.dtype, start.device
    basis = torch.zeros(basis_size, dim, dtype=dtype, device=device)
    proj = np.zeros((0, 0))  # T
    coupling = np.zeros(0)  # b
    resid = start.detach().reshape(-1).clone()  # r
    j = matvecs = 0
    theta = np.zeros(0)
    vecs = np.zeros((0, 0))
    idx = np.zeros(0, dtype=int)
    bounds = np.full(k, np.inf)
    converged = False
    scale = 0.0

    while matvecs < max_iter:
        beta = float(resid.norm())
        if j > 0 and beta <= 1e-12 * max(scale, 1e-300):
            if j >= dim:
                converged = True
                break
            # Invariant subspace found: continue in a random direction orthogonal to it.
            resid = torch.randn(dim, generator=generator, dtype=torch.float64).to(dtype=dtype)
            resid = resid.to(device)
            for _ in range(2):
                resid -= basis[:j].T @ (basis[:j] @ resid)
            coupling = np.zeros(j)
            beta = float(resid.norm())
        if j == 0 and beta == 0.0:
            raise ValueError("The start vector of Lanczos must not be zero.")
        v = resid / beta
        basis[j] = v
        w = matvec(v).reshape(-1).to(dtype)
        matvecs += 1
        active = basis[: j + 1]
        h = active @ w
        w = w - active.T @ h
        h2 = active @ w  # second pass of Gram-Schmidt keeps the basis orthonormal
        w = w - active.T @ h2
        h = (h + h2).double().cpu().numpy()
        if not np.all(np.isfinite(h)):
            raise FloatingPointError(
                "A Hessian-vector product is not finite (NaN or inf): the loss or the "
                "parameters have diverged, so no eigenvalue can be computed at this step."
            )
        new = np.zeros((j + 1, j + 1))
        new[:j, :j] = proj
        new[j, :j] = new[:j, j] = 0.5 * (h[:j] + beta * coupling)
        new[j, j] = h[j]
        proj, resid, j = new, w, j + 1
        coupling = np.zeros(j)
        coupling[-1] = 1.0

        theta, vecs = np.linalg.eigh(proj)
        scale = max(scale, float(np.max(np.abs(theta))))
        rnorm = float(resid.norm())
        res = rnorm * np.abs(coupling @ vecs)
        idx = _wanted(theta, k, which)
        bounds = _error_bounds(theta, res, idx)
        if j >= k and np.all(bounds <= tol * np.maximum(np.abs(theta[idx]), ZERO * scale)):
            converged = True
            break
        if j == basis_size and matvecs < max_iter:
            # Thick restart: keep the most wanted Ritz vectors, which span the new basis.
            keep = _wanted(theta, min(j - 1, max(k + (basis_size - k) // 2, k + 1)), which)
            s = torch.as_tensor(vecs[:, keep], dtype=dtype, device=device)
            basis[: len(keep)] = (s.T @ basis[:j]).clone()
            proj = np.diag(theta[keep])
            coupling = coupling @ vecs[:, keep]
            j = len(keep)

    if len(idx) == 0:
        raise ValueError("Lanczos needs max_iter >= 1.")
    s = torch.as_tensor(vecs[:, idx], dtype=dtype, device=device)
    eigvecs = s.T @ basis[: len(theta)]
    eigvecs = eigvecs / eigvecs.norm(dim=1, keepdim=True)
    return LanczosResult(theta[idx].copy(), eigvecs, bounds, matvecs, converged)
