"""XDiag: the exchangeable leave-one-out diagonal estimator of the XTrace paper."""

from __future__ import annotations

import torch

from cockpit_curvature._estimators.base import DiagEstimate, MatVec, matmat, rademacher


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
    top eigenvectors instead of Hutchinson's ``O(1/sqrt(m))``. The per-entry error bar is
    ``std(x_1..x_k) / sqrt(k)`` as XTrace's (the ``x_i`` are dependent: a heuristic).

    Args:
        matvec: ``v -> A v`` on flat float64 vectors (``A`` symmetric).
        dim: ``D``, the length of the vectors.
        probes: Products allowed ``m`` (at least 4; ``2 (m // 2)`` are used).
        gen: Source of the probes.

    Returns:
        The ``k`` leave-one-out estimates ``x_i`` (mean: the estimate), and
        ``hvps = 2 (m // 2)``.

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
    return DiagEstimate(samples, hvps=2 * k)
