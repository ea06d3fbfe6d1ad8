"""XTrace: the exchangeable leave-one-out version of Hutch++."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from cockpit_curvature._estimators.base import (
    MatVec,
    TraceEstimate,
    block_sums,
    clip_variance,
    matmat,
    pair_directions,
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
    (A P_(i) w_i)_b`` (unbiased for ``tr(A_bb)`` as in Hutch++). The paper's error
    estimate ``std(t_1..t_k) / sqrt(k)`` misses the covariance of the dependent ``t_i`` (it
    measured 0.6-1.0 of the spread); the variance reported adds the leave-two-out
    covariance term ``C = mean_{i != l} d_il d_li``, ``d_il = t_l - t_(l,-i)``, clipped to
    ``[1, 3]`` times the paper's (:func:`~cockpit_curvature._estimators.base.pair_directions`,
    ``clip_variance``): no further products, ``O(D k^2 + n_blocks k^4 + k^5)`` flops.
    Probes are Rademacher vectors (the paper's ``'rademacher'`` option; its default
    rescaled sphere vectors are not implemented).

    Args:
        matvec: ``v -> A v`` on flat float64 vectors.
        sizes: Number of entries of each block (``sum(sizes) = D``).
        probes: Products allowed ``m`` (at least 4; ``2 (m // 2)`` are used).
        gen: Source of the probes.

    Returns:
        The block traces, their standard errors and ``hvps = 2 (m // 2)``.

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
    est = TraceEstimate.from_samples(offset, samples, hvps=2 * k)
    blocks = [torch.split(x, sizes) for x in (q, z, omega, y)]
    gram_oz = torch.stack([ob.T @ zb for _, zb, ob, _ in zip(*blocks)])
    gram_qy = torch.stack([qb.T @ yb for qb, _, _, yb in zip(*blocks)])
    d = _pair_effects(pair_directions(r), w, c, qz, gram_oz, gram_qy)  # [k, k, n_blocks]
    d = torch.cat([d, d.sum(2, keepdim=True)], 2)  # and of the total
    cross = (d * d.transpose(0, 1)).sum((0, 1)) / (k * (k - 1))
    heuristic = torch.as_tensor(np.append(est.std_error_per_param, est.std_error)) ** 2
    se = clip_variance(heuristic, cross).sqrt().numpy()
    return replace(est, std_error_per_param=se[:-1], std_error=float(se[-1]))


def _pair_effects(
    v: Tensor, w: Tensor, c: Tensor, gram_qz: Tensor, gram_oz: Tensor, gram_qy: Tensor
) -> Tensor:
    """``d_il,b = t_l,b - t_(l,-i),b``: the change of ``t_l`` when probe ``i`` leaves its sketch.

    With ``Pi_(i,l) = Pi_(l) - v v^T`` (``v = v_il``, :func:`pair_directions`), ``c =
    Pi_(l) Q^T w_l`` and ``delta = v (v^T Q^T w_l)``, block ``b`` of ``t_l`` is
    ``tr(M_b Pi) + w_l,b^T y_l,b - (Omega_b^T Z_b)_l c - c^T (Q_b^T Y_b)_l + c^T M_b c``
    (``M_b = Q_b^T Z_b``), so ``d_il,b = v^T M_b v - (Omega_b^T Z_b)_l delta - delta^T
    (Q_b^T Y_b)_l + c^T M_b delta + delta^T M_b c - delta^T M_b delta``: ``k x k`` algebra.

    Args:
        v: ``[k, k, k]``, ``v[l, :, i] = v_il``.
        w: ``Q^T Omega``.
        c: Column ``l``: ``Pi_(l) Q^T w_l``.
        gram_qz: ``[n_blocks, k, k]``, ``Q_b^T Z_b``.
        gram_oz: ``[n_blocks, k, k]``, ``Omega_b^T Z_b``.
        gram_qy: ``[n_blocks, k, k]``, ``Q_b^T Y_b``.

    Returns:
        ``[k, k, n_blocks]``, entry ``[i, l, b]`` (zero for ``i = l``).

    """
    delta = v * torch.einsum("lji,jl->li", v, w).unsqueeze(1)  # [l, :, i]
    quad = torch.einsum("lji,bjm,lmi->ilb", v, gram_qz, v)
    lin = torch.einsum("blj,lji->ilb", gram_oz, delta) + torch.einsum(
        "bjl,lji->ilb", gram_qy, delta
    )
    mixed = torch.einsum("jl,bjm,lmi->ilb", c, gram_qz, delta) + torch.einsum(
        "lji,bjm,ml->ilb", delta, gram_qz, c
    )
    return quad - lin + mixed - torch.einsum("lji,bjm,lmi->ilb", delta, gram_qz, delta)
