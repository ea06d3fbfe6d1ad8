"""Hutch++: Hutchinson's estimator deflated by a randomized low-rank sketch."""

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


def hutchpp(
    matvec: MatVec, sizes: Sequence[int], probes: int, gen: torch.Generator
) -> TraceEstimate:
    """Hutch++ estimate of the block traces (Meyer, Musco, Musco & Woodruff, 2021).

    Meyer et al. (2021), "Hutch++: Optimal stochastic trace estimation" (SOSA), split the
    ``m = probes`` products into thirds: a Rademacher sketch ``S`` with ``k = m // 3``
    columns, ``Q = orth(A S)`` (``k`` products), ``A Q`` (``k`` products) for the exact
    trace of the captured part, and Hutchinson's estimator with the remaining ``m - 2k``
    Rademacher probes ``g_s`` on the deflated rest ``P = I - Q Q^T``::

        tr(A) = tr(Q^T A Q) + tr(P A P) ~ tr(Q^T A Q) + (1/G) sum_s (P g_s)^T A (P g_s)

    Per block ``b`` (with ``D_b`` the 0/1 diagonal selecting its entries), ``tr(D_b A) =
    tr(Q^T D_b A Q) + tr(D_b A P)`` and ``E[(P g)_b^T (A P g)_b] = tr(P D_b A P) =
    tr(D_b A P)``, so the block estimates are unbiased too and sum to the total. Error
    relative to ``||A||_*``: ``O(1/m)`` instead of Hutchinson's ``O(1/sqrt(m))``; it gains
    most when the spectrum decays. ``std_error`` is that of the Hutchinson part (the
    sample standard deviation of its ``G`` samples over ``sqrt(G)``), conditional on ``Q``.

    Args:
        matvec: ``v -> A v`` on flat float64 vectors.
        sizes: Number of entries of each block (``sum(sizes) = D``).
        probes: Total number of products ``m`` (at least 3).
        gen: Source of ``S`` (drawn first) and of the ``g_s``.

    Returns:
        The block traces, the standard errors of the Hutchinson part and ``hvps = m``.

    """
    if probes < 3:
        raise ValueError(f"Hutch++ needs at least 3 products, got probes={probes}")
    dim, k = sum(sizes), probes // 3
    q, _ = torch.linalg.qr(matmat(matvec, rademacher(gen, dim, k)))
    exact = block_sums(q * matmat(matvec, q), sizes).sum(1)
    rest = probes - 2 * k
    samples = torch.zeros(rest, len(sizes), dtype=torch.float64)
    for s in range(rest):
        g = rademacher(gen, dim, 1)[:, 0]
        w = g - q @ (q.T @ g)
        samples[s] = block_sums(w * matvec(w), sizes)
    return TraceEstimate.from_samples(exact, samples, hvps=2 * k + rest)
