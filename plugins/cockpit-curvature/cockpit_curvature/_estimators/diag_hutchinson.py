"""Hutchinson's diagonal estimator with Rademacher probes."""

from __future__ import annotations

import torch

from cockpit_curvature._estimators.base import DiagEstimate, MatVec, rademacher


def diag_hutchinson(matvec: MatVec, dim: int, probes: int, gen: torch.Generator) -> DiagEstimate:
    """Hutchinson-type estimate of ``diag(A)`` (Bekas, Kokiopoulou & Saad, 2007).

    Bekas, Kokiopoulou & Saad (2007), "An estimator for the diagonal of a matrix" (Applied
    Numerical Mathematics): for Rademacher probes ``z_1, ..., z_S`` (entries +-1, so
    ``z ⊙ z = 1`` and ``E[z_j z_l] = [j = l]``), ``E[z ⊙ A z] = diag(A)``, hence::

        diag(A) ~ (1/S) sum_s z_s ⊙ A z_s

    The samples are independent; entry ``j`` of one sample is ``A_jj + sum_{l != j} z_j
    z_l A_jl`` with variance ``sum_{l != j} A_jl^2``, so the per-entry standard error is
    ``sqrt(sum_{l != j} A_jl^2 / S)``, estimated without bias (in its square) by the sample
    standard deviation over ``sqrt(S)``. A diagonal matrix is recovered exactly.

    Args:
        matvec: ``v -> A v`` on flat float64 vectors.
        dim: ``D``, the length of the vectors.
        probes: Number of probes ``S`` (one product each; at least 2 for an error bar).
        gen: Source of the probes.

    Returns:
        The ``S`` samples (mean: the estimate), and ``hvps = S``.

    """
    samples = torch.zeros(probes, dim, dtype=torch.float64)
    for s in range(probes):
        z = rademacher(gen, dim, 1)[:, 0]
        samples[s] = z * matvec(z)
    return DiagEstimate(samples, hvps=probes)
