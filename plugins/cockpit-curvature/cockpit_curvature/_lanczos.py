"""Thick-restart Lanczos for extreme eigenpairs of a symmetric operator given by matvecs.

Lanczos (1950) in its Rayleigh-Ritz form, with full reorthogonalization and thick restarts
(Wu & Simon, 2000, "Thick-restart Lanczos method for large symmetric eigenvalue problems").
The search space is spanned by the orthonormal rows of ``Q``; each row costs one product,
kept in ``AQ``. Every iteration extracts Ritz pairs ``(theta, Q^T s)`` of
``T = Q A Q^T`` and extends ``Q`` by the residual ``r = A x - theta x`` of the most wanted
Ritz vector ``x`` that has not converged. From one start vector the residuals span the
Krylov space, so this is Lanczos' method (Parlett, 1998, "The Symmetric Eigenvalue Problem",
Ch. 13). A *block* of start vectors (the previous step's leading Ritz vectors) gives an
augmented Krylov space (Morgan, 1996, "On restarting the Arnoldi method for large
nonsymmetric eigenvalue problems"), which serves warm starts: a Rayleigh-Ritz step on the old
vectors first finds the rotation of the leading eigenvectors between two nearby operators.

Residual norms ``rho_i = ||A x_i - theta_i x_i||`` come from the small Gram matrices of
``Q`` and ``AQ`` (kept in float64), without another product.

Stopping rule: the eigenvalue error of a Ritz value is at most its residual ``rho``, and at
most ``rho^2 / delta`` when the rest of the spectrum is at distance ``delta``
(Kato-Temple inequality; Parlett, 1998, Sec. 10.3). :func:`_error_bounds` estimates
``delta`` from the nearest other Ritz value: with ``gap="converged"`` only once that one has
converged, with ``gap="ritz"`` at once (for warm starts whose block holds approximations of
the neighbouring eigenvectors). The iteration stops when ``min(rho, rho^2 / delta) <= tol *
|theta|`` for every wanted pair. Like every Krylov method it can miss an eigenvalue whose
eigenvector is (nearly) orthogonal to the start vectors; a random start makes that unlikely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

WHICH = ("largest_algebraic", "largest_magnitude")
GAPS = ("converged", "ritz")
GAP_TRUST = 0.1
"""With ``gap="converged"``, a neighbouring Ritz value counts once its residual is this fraction of the gap."""
ZERO = 1e-6
"""Eigenvalues below ``ZERO`` times the largest Ritz magnitude are measured against the latter."""
DEPENDENT = 1e-8
"""A new direction whose norm drops below this fraction in orthogonalization is dependent."""


@dataclass
class LanczosResult:
    """Wanted Ritz pairs, ordered from the most wanted (largest value or magnitude).

    Attributes:
        eigenvalues: ``[k]`` Ritz values (float64).
        eigenvectors: ``[k, D]`` unit Ritz vectors (dtype and device of the start vector).
        error_bounds: ``[k]`` estimated absolute eigenvalue errors.
        matvecs: Number of operator applications.
        converged: Whether every wanted pair met the tolerance.
        next_vector: ``[f, D]`` the ``f <= following`` unit Ritz vectors that come after the
            wanted ones (a warm start for the next, slightly different operator), or ``None``
            if the search space holds no other.

    """

    eigenvalues: np.ndarray
    eigenvectors: Tensor
    error_bounds: np.ndarray
    matvecs: int
    converged: bool
    next_vector: Tensor | None = None


def _wanted(theta: np.ndarray, k: int, which: str) -> np.ndarray:
    """Indices of the ``k`` most wanted Ritz values, most wanted first."""
    key = theta if which == "largest_algebraic" else np.abs(theta)
    return np.argsort(-key, kind="stable")[:k]


def _error_bounds(theta: np.ndarray, res: np.ndarray, idx: np.ndarray, gap: str) -> np.ndarray:
    """Estimated eigenvalue errors ``min(rho_i, rho_i^2 / delta_i)`` of the Ritz values ``idx``.

    ``rho_i`` alone bounds the distance of ``theta_i`` to the nearest eigenvalue. The gap
    ``delta_i`` to the rest of the spectrum comes from the nearest other Ritz value
    ``theta_j``. With ``gap="converged"`` it is only trusted once ``theta_j`` has converged
    (``rho_j <= GAP_TRUST * |theta_i - theta_j|``) and no Ritz value could hide an eigenvalue
    next to ``theta_i``; then ``delta_i = |theta_i - theta_j| - rho_j``. Before, an eigenvalue
    the search space has not found yet may sit in between. With ``gap="ritz"``,
    ``delta_i = |theta_i - theta_j|`` at once: right when the start block already held
    approximations of the neighbouring eigenvectors.
    """
    bounds: np.ndarray = res[idx].astype(np.float64)
    for n, i in enumerate(idx):
        others = np.delete(np.arange(len(theta)), i)
        if len(others) == 0:
            continue
        dist = np.abs(theta[others] - theta[i])
        near = int(np.argmin(dist))
        if gap == "ritz":
            if dist[near] > 0:
                bounds[n] = min(res[i], res[i] ** 2 / dist[near])
        elif res[others][near] <= GAP_TRUST * dist[near] and np.all(dist > res[others]):
            delta = dist[near] - res[others][near]
            bounds[n] = min(res[i], res[i] ** 2 / delta)
    return bounds


GRAM_CHUNK = 1 << 14
"""Columns of ``Q`` and ``AQ`` converted to float64 at a time by :func:`_gram_rows`."""


def _gram_rows(q: Tensor, aq: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The last rows of ``T``, ``G`` and ``M`` for the last rows ``v = q[-1]``, ``av = aq[-1]``.

    ``0.5 (Q av + AQ v)``, ``AQ av`` and ``Q v``, accumulated in float64 over chunks of
    columns: float32 vectors are converted a chunk at a time (in cache), not as whole
    float64 copies of the basis at every iteration.
    """
    rows: tuple[Tensor, ...] = ()
    for start in range(0, q.shape[1], GRAM_CHUNK):
        q64 = q[:, start : start + GRAM_CHUNK].double()
        aq64 = aq[:, start : start + GRAM_CHUNK].double()
        v64, av64 = q64[-1], aq64[-1]
        part = (0.5 * (q64 @ av64 + aq64 @ v64), aq64 @ av64, q64 @ v64)
        rows = tuple(r + p for r, p in zip(rows, part)) if rows else part
    return rows[0], rows[1], rows[2]


class _SearchSpace:
    """Orthonormal rows ``Q``, their products ``AQ`` and the float64 Gram matrices.

    ``T = Q AQ^T`` (symmetrized), ``G = AQ AQ^T`` and ``M = Q Q^T`` give every Ritz residual
    ``||AQ^T s - theta Q^T s||^2 = s^T G s - 2 theta s^T T s + theta^2 s^T M s`` exactly for
    the stored vectors, also when they are float32.
    """

    def __init__(self, capacity: int, dim: int, dtype: torch.dtype, device: torch.device):
        # rows beyond ``size`` are never read: no zero fill (2 x 72 MB on the 3c3d network)
        self.q = torch.empty(capacity, dim, dtype=dtype, device=device)
        self.aq = torch.empty(capacity, dim, dtype=dtype, device=device)
        self.t = np.zeros((capacity, capacity))
        self.g = np.zeros((capacity, capacity))
        self.m = np.zeros((capacity, capacity))
        self.size = 0

    def orthogonalize(self, v: Tensor) -> Tensor:
        """``v`` minus its projection on the rows of ``Q`` (two passes of Gram-Schmidt)."""
        q = self.q[: self.size]
        for _ in range(2):
            v = v - q.T @ (q @ v)
        return v

    def add(self, v: Tensor, av: Tensor) -> None:
        """Append the unit vector ``v`` and its product ``av``."""
        j = self.size
        self.q[j], self.aq[j] = v, av
        t, g, m = (row.cpu().numpy() for row in _gram_rows(self.q[: j + 1], self.aq[: j + 1]))
        if not (np.all(np.isfinite(t)) and np.all(np.isfinite(g))):
            raise FloatingPointError(
                "A Hessian-vector product is not finite (NaN or inf): the loss or the "
                "parameters have diverged, so no eigenvalue can be computed at this step."
            )
        for mat, row in ((self.t, t), (self.g, g), (self.m, m)):
            mat[j, : j + 1] = mat[: j + 1, j] = row
        self.size = j + 1

    def ritz(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ritz values ``theta``, coefficients ``S`` (columns) and residual norms."""
        j = self.size
        t, g, m = self.t[:j, :j], self.g[:j, :j], self.m[:j, :j]
        theta, s = np.linalg.eigh(t)
        sq = (
            np.einsum("ai,ab,bi->i", s, g, s)
            - 2 * theta * np.einsum("ai,ab,bi->i", s, t, s)
            + theta**2 * np.einsum("ai,ab,bi->i", s, m, s)
        )
        return theta, s, np.sqrt(np.maximum(sq, 0.0))

    def combine(self, coeffs: np.ndarray) -> tuple[Tensor, Tensor]:
        """``(S^T Q, S^T AQ)`` for coefficient columns ``S``."""
        s = torch.as_tensor(coeffs, dtype=self.q.dtype, device=self.q.device)
        return s.T @ self.q[: self.size], s.T @ self.aq[: self.size]

    def restart(self, coeffs: np.ndarray) -> None:
        """Keep only the span of the Ritz vectors with coefficient columns ``coeffs``."""
        q, aq = self.combine(coeffs)
        n, j = coeffs.shape[1], self.size
        for mat in (self.t, self.g, self.m):
            mat[:n, :n] = coeffs.T @ mat[:j, :j] @ coeffs
        self.q[:n], self.aq[:n] = q, aq
        self.size = n


def _residuals(
    space: _SearchSpace, theta: np.ndarray, coeffs: np.ndarray, idx: np.ndarray, res: np.ndarray
) -> Tensor:
    """Residual vectors ``A x_i - theta_i x_i`` of the Ritz pairs ``idx`` (rows).

    Their norms replace the Gram-matrix estimates in ``res``, whose cancellation limits them
    to about ``sqrt(eps) |theta|``, for the pairs whose accuracy decides convergence.
    """
    x, ax = space.combine(coeffs[:, idx])
    rows = ax - torch.as_tensor(theta[idx], dtype=x.dtype, device=x.device)[:, None] * x
    res[idx] = rows.double().norm(dim=1).cpu().numpy()
    return rows


def lanczos(
    matvec: Callable[[Tensor], Tensor],
    start: Tensor,
    k: int = 1,
    which: str = "largest_algebraic",
    tol: float = 1e-4,
    max_iter: int = 100,
    basis_size: int = 20,
    generator: torch.Generator | None = None,
    gap: str = "converged",
    following: int = 1,
) -> LanczosResult:
    """Compute the ``k`` wanted eigenpairs of the symmetric operator ``matvec``.

    Args:
        matvec: ``v -> A v`` for flat vectors of the shape of ``start``'s rows.
        start: Start vector ``[D]``, or a block ``[m, D]`` of start vectors (e.g. the leading
            Ritz vectors of a previous, nearby operator); each costs one product.
        k: Number of wanted eigenpairs.
        which: ``"largest_algebraic"`` or ``"largest_magnitude"``.
        tol: Relative tolerance on the estimated eigenvalue error (relative to ``|theta|``, or
            to ``ZERO`` times the largest Ritz magnitude for eigenvalues near zero).
        max_iter: Maximum number of matvecs.
        basis_size: Vectors kept before a thick restart (memory: twice that many vectors,
            the basis and its products).
        generator: Random numbers for a new direction after an invariant subspace is found.
        gap: How the Kato-Temple gap is estimated (see :func:`_error_bounds`): ``"converged"``
            (safe for any start) or ``"ritz"`` (for a start block that holds approximations of
            the ``k + 1`` leading eigenvectors).
        following: How many Ritz vectors after the wanted ones to return as ``next_vector``
            (a larger warm-start block; at most what the search space holds).

    Returns:
        The wanted Ritz pairs and convergence information.

    """
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}.")
    if gap not in GAPS:
        raise ValueError(f"gap must be one of {GAPS}, got {gap!r}.")
    if max_iter < 1:
        raise ValueError("Lanczos needs max_iter >= 1.")
    block = start.detach().reshape(-1, start.shape[-1]) if start.dim() > 1 else start.reshape(1, -1)
    dim = block.shape[1]
    k = min(k, dim)
    basis_size = max(min(basis_size, dim), min(k + 2, dim), min(len(block), dim))
    space = _SearchSpace(basis_size, dim, block.dtype, block.device)
    matvecs, scale, converged = 0, 0.0, False
    pending = list(block)  # start vectors not yet in the space
    theta, coeffs, res = np.zeros(0), np.zeros((0, 0)), np.zeros(0)
    idx, bounds = np.zeros(0, dtype=int), np.full(k, np.inf)
    residuals = torch.zeros(0)

    while matvecs < max_iter:
        if space.size >= dim:
            converged = True  # the space is everything: the Ritz pairs are exact
            break
        if pending:
            v = pending.pop(0)
            norm0 = float(v.norm())
            v = space.orthogonalize(v)
            norm = float(v.norm())
            if norm > DEPENDENT * norm0:  # else a zero or dependent start vector: skip it
                space.add(v / norm, matvec(v / norm).reshape(-1).to(block.dtype))
                matvecs += 1
            if pending:
                continue  # finish the start block before judging convergence
            if space.size == 0:
                raise ValueError("The start vector of Lanczos must not be zero.")
        else:
            # residual of the most wanted Ritz pair that has not converged yet
            open_ = np.flatnonzero(bounds > tol * np.maximum(np.abs(theta[idx]), ZERO * scale))
            v = residuals[int(open_[0]) if len(open_) else 0]
            norm0 = float(v.norm())
            v = space.orthogonalize(v)
            norm = float(v.norm())
            if norm <= 1e-12 * scale or norm <= DEPENDENT * norm0:
                # invariant subspace found: continue in a random direction orthogonal to it
                v = torch.randn(dim, generator=generator, dtype=torch.float64)
                v = space.orthogonalize(v.to(dtype=block.dtype, device=block.device))
                norm = float(v.norm())
            space.add(v / norm, matvec(v / norm).reshape(-1).to(block.dtype))
            matvecs += 1

        theta, coeffs, res = space.ritz()
        scale = max(scale, float(np.max(np.abs(theta))))
        idx = _wanted(theta, k, which)
        residuals = _residuals(space, theta, coeffs, idx, res)
        bounds = _error_bounds(theta, res, idx, gap)
        if space.size >= k and np.all(bounds <= tol * np.maximum(np.abs(theta[idx]), ZERO * scale)):
            converged = True
            break
        if space.size == basis_size < dim and matvecs < max_iter:
            # thick restart: keep the most wanted Ritz vectors, which span the new space
            keep = _wanted(theta, min(space.size - 1, max(k + (basis_size - k) // 2, k + 1)), which)
            space.restart(coeffs[:, keep])
            theta, coeffs, res = theta[keep], np.eye(len(keep)), res[keep]
            idx = _wanted(theta, k, which)  # the same pairs in the same order: same residuals

    if space.size == 0:
        raise ValueError("The start vector of Lanczos must not be zero.")
    if len(theta) != space.size:  # max_iter ran out within the start block
        theta, coeffs, res = space.ritz()
        idx = _wanted(theta, k, which)
        bounds = _error_bounds(theta, res, idx, gap)
    order = _wanted(theta, min(k + max(following, 0), len(theta)), which)
    vectors, _ = space.combine(coeffs[:, order])
    vectors = vectors / vectors.norm(dim=1, keepdim=True)
    return LanczosResult(
        theta[idx].copy(),
        vectors[: len(idx)],
        bounds,
        matvecs,
        converged,
        vectors[len(idx) :] if len(order) > len(idx) else None,
    )
