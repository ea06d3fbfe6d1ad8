"""XTrace: the exchangeable leave-one-out version of Hutch++."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cockpit_curvature._estimators.base import (
    MatVec,
    TraceEstimate,
    block_sums,
    matmat,
    rademacher,
)


def xtrace(
    matvec: MatVec, sizes: Sequence[int], probes: int, gen: torch.Generator
) -> TraceEstimate:
    """XTrace estimate of the block traces (Epperly, Tropp & Webber, 2024).

    Epperly, Tropp & Webber (2024), "XTrace: Making the most of every sample in stochastic
    trace estimation" (SIAM J. Matrix Anal. Appl.), use each of ``k = probes // 2``
    Rademacher probes ``w_i`` both for the low-rank sketch and for the Hutchinson
    correction. With ``Y = A W = Q R`` (``k`` products) and ``Q_(i)`` an orthonormal basis
    of ``A W_(-i)`` (all probes but ``w_i``), ``P_(i) = I - Q_(i) Q_(i)^T``::

        t_i = tr(Q_(i)^T A Q_(i)) + (P_(i) w_i)^T A (P_(i) w_i),   tr(A) ~ (1/k) sum_i t_i

    Each ``t_i`` is a Hutch++ estimate whose sketch is independent of its probe, hence
    unbiased. All ``t_i`` need only ``A Q`` (``k`` more products): ``Q_(i) = Q U_i`` with
    ``U_i = orth(R[:, -i])``, so ``A Q_(i) = (A Q) U_i``, ``A P_(i) w_i = A w_i - (A Q) U_i
    U_i^T Q^T w_i``. Per block ``b``, ``t_i,b = tr(Q^T D_b (A Q) U_i U_i^T) + (P_(i) w_i)_b^T
    (A P_(i) w_i)_b`` (unbiased for ``tr(A_bb)`` as in Hutch++). The error estimate is the
    paper's ``std(t_1..t_k) / sqrt(k)`` (the ``t_i`` are dependent, so it is a heuristic).
    Probes are Rademacher vectors (the paper's ``'rademacher'`` option; its default
    rescaled sphere vectors are not implemented).

    Args:
        matvec: ``v -> A v`` on flat float64 vectors.
        sizes: Number of entries of each block (``sum(sizes) = D``).
        probes: Products allowed ``m`` (at least 4; ``2 (m // 2)`` are used).
        gen: Source of the probes.

    Returns:
        The block traces, the paper's error estimates and ``hvps = 2 (m // 2)``.

    """
    if probes < 4:
        raise ValueError(f"XTrace needs at least 4 products, got probes={probes}")
    sizes, dim, k = list(sizes), sum(sizes), probes // 2
    omega = rademacher(gen, dim, k)
    y = matmat(matvec, omega)
    q, r = torch.linalg.qr(y)
    z = matmat(matvec, q)
    w = q.T @ omega
    # U_i = orth(R without column i), all i at once: [k, k, k - 1]; proj[i] = U_i U_i^T
    keep = [[j for j in range(k) if j != i] for i in range(k)]
    u, _ = torch.linalg.qr(torch.stack([r[:, cols] for cols in keep]))
    proj = u @ u.transpose(1, 2)
    c = torch.einsum("ijl,li->ji", proj, w)  # column i: U_i U_i^T Q^T w_i
    resid = omega - q @ c  # column i: P_(i) w_i
    a_resid = y - z @ c  # column i: A P_(i) w_i
    # tr(Q^T D_b A Q U_i U_i^T) = sum_jl (Q_b^T Z_b)_jl proj[i]_lj
    qz = torch.stack([qb.T @ zb for qb, zb in zip(torch.split(q, sizes), torch.split(z, sizes))])
    exact = torch.einsum("bjl,ilj->ib", qz, proj)
    samples = exact + block_sums(resid * a_resid, sizes).T
    offset = torch.zeros(len(sizes), dtype=torch.float64)
    return TraceEstimate.from_samples(offset, samples, hvps=2 * k)
