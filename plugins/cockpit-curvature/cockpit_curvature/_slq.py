"""Stochastic Lanczos quadrature (SLQ): the eigenvalue density of a symmetric operator.

The spectral density of a symmetric ``D x D`` matrix ``A = sum_i lambda_i u_i u_i^T`` is
the measure ``phi = (1/D) sum_i delta(t - lambda_i)``. For a unit vector ``v``, the measure
``mu_v = sum_i (u_i^T v)^2 delta(t - lambda_i)`` has moments ``v^T A^p v``. ``m`` steps of
Lanczos from ``v`` give the tridiagonal ``T_m = S diag(theta) S^T``; the nodes ``theta_j``
and weights ``tau_j = S_1j^2`` form the ``m``-point Gauss quadrature rule of ``mu_v``,
exact for polynomials of degree below ``2m`` (Golub & Meurant, 2010, "Matrices, Moments and
Quadrature with Applications", Ch. 6). Probes with ``E[v v^T] = I / D`` (normalized
Rademacher or Gaussian vectors) have ``E[mu_v] = phi``, so the average of the rules over
``n`` probes estimates ``phi`` (Lin, Saad & Yang, 2016, "Approximating spectral densities of
large matrices", SIAM Review; Ghorbani, Krishnan & Xiao, 2019, "An Investigation into
Neural Net Optimization via Hessian Eigenvalue Density", ICML). A Gaussian kernel of width
``sigma`` turns the discrete rule into a density on a grid:

    phi_sigma(t) = sum_l w_l N(t; theta_l, sigma^2),    w_l = tau_l / n.

Lanczos here keeps every vector and orthogonalizes each new one against all of them twice
(full reorthogonalization), so ``T_m`` stays the projection of ``A`` even in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

DISTRIBUTIONS = ("rademacher", "gaussian")
PAD = 5.0
"""The grid reaches this many ``sigma`` beyond the outermost nodes (tail mass < 3e-7 each)."""
DEPENDENT = 1e-8
"""A Lanczos vector whose norm drops below this fraction in orthogonalization ends the run."""


@dataclass
class Quadrature:
    """The averaged Gauss quadrature rules of several probes (probe-major order).

    Attributes:
        nodes: ``[N]`` Ritz values of every probe's tridiagonal matrix (float64).
        weights: ``[N]`` squared first components of their eigenvectors over the number of
            probes; they sum to one.
        matvecs: Number of operator applications.

    """

    nodes: np.ndarray
    weights: np.ndarray
    matvecs: int


def lanczos_tridiagonal(
    matvec: Callable[[Tensor], Tensor], start: Tensor, steps: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Run ``steps`` Lanczos steps from ``start`` with full reorthogonalization.

    Args:
        matvec: ``v -> A v`` for flat vectors shaped like ``start``.
        start: Start vector ``[D]`` (need not be normalized; its dtype and device are used).
        steps: Most Lanczos steps ``m`` (one product each); fewer when the Krylov space is
            invariant (then the rule is exact for ``mu_v``) or ``D`` is smaller.

    Returns:
        ``(alpha [m], beta [m - 1], matvecs)``: the diagonal and off-diagonal of ``T_m``.

    """
    dim = start.numel()
    steps = min(int(steps), dim)
    if steps < 1:
        raise ValueError("Lanczos needs at least one step.")
    norm = float(start.norm())
    if norm == 0.0:
        raise ValueError("The start vector of Lanczos must not be zero.")
    tiny = max(DEPENDENT, 100 * torch.finfo(start.dtype).eps)
    basis = torch.empty(steps, dim, dtype=start.dtype, device=start.device)
    q = start.reshape(-1) / norm
    alpha: list[float] = []
    beta: list[float] = []
    for j in range(steps):
        basis[j] = q
        w = matvec(q).reshape(-1).to(start.dtype)
        w_norm = float(w.double().norm())
        if not math.isfinite(w_norm):
            raise FloatingPointError(
                "A Hessian-vector product is not finite (NaN or inf): the loss or the "
                "parameters have diverged, so no spectrum can be computed at this step."
            )
        alpha.append(float(q.double() @ w.double()))
        if j == steps - 1:
            break
        done = basis[: j + 1]
        for _ in range(2):  # removes alpha_j q_j and beta_{j-1} q_{j-1} and round-off
            w = w - done.T @ (done @ w)
        b = float(w.double().norm())
        if b <= tiny * w_norm:
            break  # invariant Krylov space: the rule is exact for mu_v
        beta.append(b)
        q = w / b
    return np.asarray(alpha), np.asarray(beta), len(alpha)


def gauss_quadrature(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (ascending) and weights of the Gauss rule of the tridiagonal ``T``.

    Nodes are the eigenvalues ``theta_j`` of ``T``, weights the squared first components
    ``S_1j^2`` of its unit eigenvectors (Golub & Welsch, 1969, "Calculation of Gauss
    quadrature rules").
    """
    t = np.diag(np.asarray(alpha, dtype=np.float64))
    if len(beta):
        off = np.asarray(beta, dtype=np.float64)
        t += np.diag(off, 1) + np.diag(off, -1)
    theta, s = np.linalg.eigh(t)
    return theta, s[0] ** 2


def probe(dim: int, distribution: str, generator: torch.Generator | None) -> Tensor:
    """A random unit vector ``[D]`` (float64, CPU) with ``E[v v^T] = I / D``.

    ``"rademacher"``: entries ``+-1 / sqrt(D)``; ``"gaussian"``: ``z / ||z||`` with
    ``z ~ N(0, I)`` (uniform on the sphere).
    """
    if distribution == "rademacher":
        signs = torch.randint(0, 2, (dim,), generator=generator, dtype=torch.float64)
        return (2 * signs - 1) / math.sqrt(dim)
    if distribution == "gaussian":
        z = torch.randn(dim, generator=generator, dtype=torch.float64)
        unit: Tensor = z / z.norm()
        return unit
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}.")


def slq(
    matvec: Callable[[Tensor], Tensor],
    dim: int,
    probes: int,
    steps: int,
    distribution: str = "rademacher",
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> Quadrature:
    """Stochastic Lanczos quadrature: the average of ``probes`` Gauss rules of ``steps`` nodes.

    Args:
        matvec: ``v -> A v`` for flat vectors ``[D]`` of ``dtype`` on ``device``.
        dim: ``D``.
        probes: Number of random start vectors ``n``.
        steps: Lanczos steps ``m`` per probe (at most ``D``).
        distribution: ``"rademacher"`` or ``"gaussian"`` (see :func:`probe`).
        generator: Random numbers of the probes.
        dtype: dtype of the Lanczos vectors (that of the parameters).
        device: Their device.

    Returns:
        Nodes and weights (summing to one) of all probes, and the products used.

    """
    if probes < 1:
        raise ValueError("SLQ needs at least one probe.")
    nodes, weights, matvecs = [], [], 0
    for _ in range(probes):
        start = probe(dim, distribution, generator).to(dtype=dtype, device=device)
        alpha, beta, used = lanczos_tridiagonal(matvec, start, steps)
        theta, tau = gauss_quadrature(alpha, beta)
        nodes.append(theta)
        weights.append(tau / tau.sum() / probes)  # tau sums to 1 up to round-off
        matvecs += used
    return Quadrature(np.concatenate(nodes), np.concatenate(weights), matvecs)


def broaden(
    nodes: np.ndarray,
    weights: np.ndarray,
    sigma: float,
    points: int,
    also: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Gaussian-broadened density ``sum_l w_l N(t; theta_l, s^2)`` on a uniform grid.

    ``s = sigma * (hi - lo)`` with ``[lo, hi]`` the range of the nodes and of ``also`` (e.g.
    the top eigenvalues; the largest magnitude, or 1, if the range is empty); the grid spans
    ``[lo - PAD s, hi + PAD s]``. With a spacing ``h <= s`` the trapezoidal rule integrates
    each kernel to within ``2 exp(-2 pi^2 s^2 / h^2) < 6e-9`` of its mass on the grid
    (Trefethen & Weideman, 2014, "The exponentially convergent trapezoidal rule"), so the
    density integrates to ``sum_l w_l`` up to that and the tails beyond ``PAD s``.

    Returns:
        ``(grid [points], density [points], s)``.

    """
    nodes = np.asarray(nodes, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    ends = nodes if also is None else np.concatenate([nodes, np.asarray(also, dtype=np.float64)])
    lo, hi = float(ends.min()), float(ends.max())
    width = hi - lo
    if not width > 0:
        width = max(abs(lo), abs(hi)) or 1.0
    s = sigma * width
    grid = np.linspace(lo - PAD * s, hi + PAD * s, points)
    kernel = np.exp(-0.5 * ((grid[:, None] - nodes[None, :]) / s) ** 2)
    density = kernel @ weights / (s * math.sqrt(2 * math.pi))
    return grid, density, s
