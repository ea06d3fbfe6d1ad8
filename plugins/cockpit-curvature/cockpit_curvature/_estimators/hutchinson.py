"""Hutchinson's trace estimator with Rademacher probes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cockpit_curvature._estimators.base import MatVec, TraceEstimate, block_sums, rademacher


def hutchinson(
    matvec: MatVec, sizes: Sequence[int], probes: int, gen: torch.Generator
) -> TraceEstimate:
    """Hutchinson's estimator of the block traces (Hutchinson, 1989).

    Hutchinson (1989), "A stochastic estimator of the trace of the influence matrix for
    Laplacian smoothing splines": for Rademacher probes ``v_1, ..., v_S`` (entries +-1,
    ``E[v v^T] = I``), ``E[v_b^T (A v)_b] = tr(A_bb)`` for each diagonal block ``b``, so::

        tr(A_bb) ~ (1/S) sum_s v_s,b^T (A v_s)_b,      tr(A) = sum_b tr(A_bb)

    The ``S`` samples are independent; the standard error is their sample standard
    deviation over ``sqrt(S)`` (for Rademacher probes the variance of one sample of
    ``tr(A)`` is ``2 (||A||_F^2 - sum_j A_jj^2)``).

    Args:
        matvec: ``v -> A v`` on flat float64 vectors.
        sizes: Number of entries of each block (``sum(sizes) = D``).
        probes: Number of probes ``S`` (one product each).
        gen: Source of the probes.

    Returns:
        The block traces, their standard errors and ``hvps = S``.

    """
    dim = sum(sizes)
    samples = torch.zeros(probes, len(sizes), dtype=torch.float64)
    for s in range(probes):
        v = rademacher(gen, dim, 1)[:, 0]
        samples[s] = block_sums(v * matvec(v), sizes)
    offset = torch.zeros(len(sizes), dtype=torch.float64)
    return TraceEstimate.from_samples(offset, samples, hvps=probes)
