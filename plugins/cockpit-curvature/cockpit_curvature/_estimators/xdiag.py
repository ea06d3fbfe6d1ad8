"""XDiag: the exchangeable leave-one-out diagonal estimator of the XTrace paper."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_curvature._estimators.base import (
    DiagEstimate,
    MatVec,
    PairCovariance,
    matmat,
    pair_directions,
    rademacher,
)


def xdiag(matvec: MatVec, dim: int, probes: int, gen: torch.Generator) -> DiagEstimate:
    """XDiag estimate of ``diag(A)`` for a symmetric ``A`` (Epperly, Tropp & Webber, 2024).

    Epperly, Tropp & Webber (2024), "XTrace: Making the most of every sample in stochastic
    trace estimation" (SIAM J. Matrix Anal. Appl., section on diagonal estimation), apply
    the leave-one-out idea of XTrace to Diag++ (Baston & Nakatsukasa, 2022, "Stochastic
    diagonal estimation: probabilistic bounds and an improved algorithm"):
    ``diag(A) = diag(Q Q^T A) + diag((I - Q Q^T) A)``, the first part exact, the second by
    Hutchinson's diagonal estimator. With ``k = probes // 2`` Rademacher probes ``w_i``,
    ``Y = A W = Q R`` (``k`` products), ``Z = A Q`` (``k`` more) and ``Q_(i)`` an
    orthonormal basis of ``A W_(-i)`` (all probes but ``w_i``)::

        x_i = diag(Q_(i) Q_(i)^T A) + w_i ⊙ (I - Q_(i) Q_(i)^T) A w_i,
        diag(A) ~ (1/k) sum_i x_i

    ``Q_(i)`` does not depend on ``w_i``, so each ``x_i`` is unbiased. No further products:
    ``Q_(i) Q_(i)^T = Q (I - s_i s_i^T) Q^T`` with ``s_i`` the unit vector orthogonal to
    the columns of ``R`` other than ``i`` (taken from a complete QR of them, which stays
    finite if ``A W`` is rank deficient), so ``diag(Q_(i) Q_(i)^T A) = rowsum(Q ⊙ Z) -
    (Q s_i) ⊙ (Z s_i)`` (``A`` symmetric), and ``(I - Q_(i) Q_(i)^T) A w_i = Q s_i (s_i^T
    r_i)`` as ``A w_i = Q r_i``. Error ``O(1/m)`` relative to the part of ``A`` outside its
    top eigenvectors instead of Hutchinson's ``O(1/sqrt(m))``. Error bars: the paper's
    ``std(x_1..x_k) / sqrt(k)`` misses the covariance of the dependent ``x_i``; as for
    XTrace, the leave-two-out term ``C`` is added (clipped, see
    :func:`~cockpit_curvature._estimators.base.pair_directions`).

    Args:
        matvec: ``v -> A v`` on flat float64 vectors (``A`` symmetric).
        dim: ``D``, the length of the vectors.
        probes: Products allowed ``m`` (at least 4; ``2 (m // 2)`` are used).
        gen: Source of the probes.

    Returns:
        The ``k`` leave-one-out estimates ``x_i`` (mean: the estimate), their pair
        covariance term and ``hvps = 2 (m // 2)``.

    """
    if probes < 4:
        raise ValueError(f"XDiag needs at least 4 products, got probes={probes}")
    k = probes // 2
    omega = rademacher(gen, dim, k)
    y = matmat(matvec, omega)
    q, r = torch.linalg.qr(y)
    z = matmat(matvec, q)
    # s_i: last column of a complete QR of R without column i, for all i at once
    keep = [[j for j in range(k) if j != i] for i in range(k)]
    full, _ = torch.linalg.qr(torch.stack([r[:, cols] for cols in keep]), mode="complete")
    s = full[:, :, -1].T  # column i: s_i
    qs, zs = q @ s, z @ s
    coef = (s * r).sum(0)  # s_i^T r_i
    samples = (q * z).sum(1) - (qs * zs).T + (omega * qs * coef).T
    return DiagEstimate(samples, hvps=2 * k, pair_covariance=_pair_covariance(q, z, omega, r))


def _pair_covariance(q: Tensor, z: Tensor, omega: Tensor, r: Tensor) -> PairCovariance:
    """The term ``C = mean_{i != l} f(d_il) f(d_li)`` of the error bar of ``f(estimate)``.

    ``d_il = x_l - x_(l,-i)`` is the change of ``x_l`` when probe ``i`` leaves its sketch
    (:func:`~cockpit_curvature._estimators.base.pair_directions`): with ``Pi_(l) -
    Pi_(i,l) = v v^T`` and ``A w_l = Q r_l``, ``d_il = (Q v) ⊙ (Z v - w_l (v^T r_l))``.
    ``f`` is each entry (``O(D k^3)``: two ``[D, k] x [k, k]`` products per ``l``) or a
    weighted block sum, ``f_b(d_il) = v^T G_b v - (v^T r_l) v^T H_b e_l`` with ``G_b =
    Q_b^T diag(u_b) Z_b`` and ``H_b = Q_b^T diag(u_b) Omega_b`` (``O(D k^2 + n_b k^4)``).
    Computed when asked.
    """
    v = pair_directions(r)  # v[l, :, i] = v_il
    k = r.shape[1]

    def per_entry() -> Tensor:
        total = torch.zeros(q.shape[0], dtype=q.dtype, device=q.device)
        for left in range(k):
            mine = v[left]  # column i: v_il
            theirs = v[:, :, left].T  # column i: v_li
            d_mine = (q @ mine) * (z @ mine - omega[:, left : left + 1] * (mine.T @ r[:, left]))
            d_theirs = (q @ theirs) * (z @ theirs - omega * (theirs * r).sum(0))
            total += (d_mine * d_theirs).sum(1)
        return total

    def cross(weights: Tensor | None, sizes: Sequence[int] | None) -> Tensor:
        if weights is None:
            return per_entry() / (k * (k - 1))
        parts = list(sizes) if sizes is not None else [len(weights)]
        blocks = zip(*(torch.split(x, parts) for x in (q, z, omega, weights)))
        grams = [
            ((qb * ub[:, None]).T @ zb, (qb * ub[:, None]).T @ ob) for qb, zb, ob, ub in blocks
        ]
        g, h = (torch.stack(x) for x in zip(*grams))
        quad = torch.einsum("lji,bjm,lmi->ilb", v, g, v)
        lin = torch.einsum("lji,jl->il", v, r)[..., None] * torch.einsum("lji,bjl->ilb", v, h)
        f = quad - lin  # [i, l, b]: f_b(d_il)
        out = (f * f.transpose(0, 1)).sum((0, 1)) / (k * (k - 1))
        return out if sizes is not None else out[0]

    return cross
