"""Common pieces of the trace and diagonal estimators: result types, probes, per-block sums."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

MatVec = Callable[[Tensor], Tensor]
"""``v -> A v`` for a flat float64 vector ``v`` of length ``D`` (one product per call)."""

CALIBRATED_MIN_PRODUCTS = 24
"""Fewest products from which the leave-one-out estimators' error bars are reported.

Measured over 400 seeds on five test problems (``docs/quantities/curvature.md``, "Error
bars of XTrace and XDiag"): the root-mean-square reported standard error of XTrace (total
and per block) and of XDiag's weighted sums (what the TIC reports) was within 20% of the
actual spread of the estimate on every problem from ``m = 24`` products on, but not below
(at ``m = 12`` up to 1.40 per block and 1.31 per XDiag entry; at ``m = 4``-``6`` down to
0.55-0.75). Single XDiag entries, which no quantity reports, stay up to 1.23 on the tiny
MLP at 24 (conservative). With fewer products the quantities report the estimate without
an error bar (``std_error`` ``None``). Hutchinson's and Hutch++'s error bars hold at any
budget.
"""

MAX_INFLATION = 3.0
"""Upper clip of ``(std(t)^2 / k + C) / (std(t)^2 / k)`` (see :func:`pair_directions`)."""

PairCovariance = Callable[[Tensor | None, Sequence[int] | None], Tensor]
"""``(weights, sizes) -> C``: the leave-two-out covariance term (:func:`pair_directions`) of
the same function of the diagonal as :meth:`DiagEstimate.std_error_of`, of its shape."""


@dataclass(frozen=True)
class TraceEstimate:
    """An estimate of ``tr(A)`` and of the trace of each diagonal block ``A_bb``.

    Attributes:
        per_param: ``[n_blocks]`` estimates of ``tr(A_bb)``.
        std_error_per_param: ``[n_blocks]`` standard errors of ``per_param`` (NaN when the
            estimator has fewer than two samples to compare).
        std_error: Standard error of ``total``.
        hvps: Matrix-vector products used.

    """

    per_param: np.ndarray
    std_error_per_param: np.ndarray
    std_error: float
    hvps: int

    @property
    def total(self) -> float:
        """Estimate of ``tr(A)``: the sum of the block estimates."""
        return float(self.per_param.sum())

    @classmethod
    def from_samples(cls, offset: Tensor, samples: Tensor, hvps: int) -> TraceEstimate:
        """Mean and standard error of ``offset + samples`` (``samples``: ``[n, n_blocks]``).

        The standard error is ``std(samples, ddof=1) / sqrt(n)`` per block, and of the row
        sums for the total; ``offset`` (``[n_blocks]``) is an exactly computed part.
        """
        n = samples.shape[0]
        per_param = (offset + samples.mean(0)).numpy()
        if n < 2:
            nan = float("nan")
            return cls(per_param, np.full(per_param.shape, nan), nan, hvps)
        se_blocks = (samples.std(0, correction=1) / math.sqrt(n)).numpy()
        se_total = float(samples.sum(1).std(correction=1) / math.sqrt(n))
        return cls(per_param, se_blocks, se_total, hvps)


@dataclass(frozen=True)
class DiagEstimate:
    """An estimate of ``diag(A)`` as the mean of ``n`` unbiased sample vectors.

    Keeping the samples (``n x D`` numbers, as many as the probes and their products)
    gives the standard error of any linear function of the diagonal, which is what the
    delta method needs to propagate the error into a smooth function of it.

    Attributes:
        samples: ``[n, D]``; row ``i`` is an unbiased estimate of ``diag(A)``.
        hvps: Matrix-vector products used.
        pair_covariance: For dependent (leave-one-out) samples, the covariance term ``C``
            added to ``std(samples)^2 / n`` (see :func:`pair_directions`); ``None`` for
            independent samples.

    """

    samples: Tensor
    hvps: int
    pair_covariance: PairCovariance | None = field(default=None, repr=False)

    @property
    def diagonal(self) -> Tensor:
        """``[D]`` estimate of ``diag(A)``: the mean of the samples."""
        return self.samples.mean(0)

    @property
    def std_error(self) -> Tensor:
        """``[D]`` per-entry standard errors (:meth:`std_error_of`; NaN if ``n < 2``)."""
        return self.std_error_of(None)

    def std_error_of(self, weights: Tensor | None, sizes: Sequence[int] | None = None) -> Tensor:
        """Standard error of ``w^T d`` (``d`` the estimate), or of each block's part of it.

        Args:
            weights: ``[D]`` weights ``w``; ``None`` for the per-entry errors (``[D]``).
            sizes: Entries of each block: return ``[n_blocks]`` errors of
                ``sum_{j in b} w_j d_j``; ``None``: one error of ``w^T d`` (a 0-d tensor).

        Returns:
            ``std`` over the ``n`` samples of the same function of each sample, over
            ``sqrt(n)`` (with leave-one-out samples: ``sqrt(clip(std^2 / n + C))`` with
            the pair covariance term ``C``, see :func:`clip_variance`); NaN with fewer
            than two samples.

        """
        n = self.samples.shape[0]
        if weights is None:
            values = self.samples
        elif sizes is None:
            values = self.samples @ weights
        else:
            values = block_sums((self.samples * weights).T, sizes).T
        if n < 2:
            return torch.full(values.shape[1:], float("nan"), dtype=values.dtype)
        var = values.var(0, correction=1) / n
        if self.pair_covariance is not None:
            var = clip_variance(var, self.pair_covariance(weights, sizes))
        return var.sqrt()


def pair_directions(r: Tensor) -> Tensor:
    """Unit vectors ``v_il`` with ``Pi_(l) - Pi_(i,l) = v_il v_il^T``, as ``[k, k, k]``.

    ``Pi_S`` projects onto the span of the columns ``S`` of ``r`` (``k x k``), ``Pi_(l)``
    onto all but ``l``, ``Pi_(i,l)`` all but ``i`` and ``l``, so ``v_il`` is the normalized
    part of column ``i`` orthogonal to the others but ``l``. Entry ``[l, :, i]`` is ``v_il``;
    zero for ``i = l`` or a dependent column.

    Variance of a leave-one-out mean (XTrace, XDiag; Epperly, Tropp & Webber, 2024): the
    estimate is ``(1/k) sum_l t_l`` with exchangeable, dependent ``t_l`` (each one's sketch
    holds the other probes), so ``Var = Var(t)/k + (1 - 1/k) Cov(t_i, t_l)``, while
    ``E[std(t)^2 / k] = (Var(t) - Cov(t_i, t_l)) / k``: the paper's ``std(t)/sqrt(k)``
    lacks ``Cov(t_i, t_l)``. Let ``d_il = t_l - t_(l,-i)``, the change of ``t_l`` when probe
    ``i`` also leaves its sketch (``Pi_(l) -> Pi_(i,l)``). ``t_(l,-i)`` and ``t_(i,-l)``
    are uncorrelated (each has mean ``theta`` over its own probe, the other's sketch
    excludes that probe), so ``Cov(t_i, t_l) = E[d_il d_li] + 2 E[(t_(l,-i) - theta)
    d_li]``. The second term needs ``theta`` and is noisy; the estimate used keeps the
    first, ``Var ~ std(t)^2 / k + C`` with ``C = mean_{i != l} d_il d_li``, then
    :func:`clip_variance`. Measured within 20% of the spread from ``m = 24`` products on
    the test problems (``docs/quantities/curvature.md``). Cost ``O(k^5)`` here, no products.
    """
    k = r.shape[1]
    out = torch.zeros(k, k, k, dtype=r.dtype, device=r.device)
    tol = 1e-12 * torch.linalg.norm(r)
    for left in range(k):
        others = [i for i in range(k) if i != left]
        rest = torch.stack([r[:, [j for j in others if j != i]] for i in others])
        u, _ = torch.linalg.qr(rest)  # [k - 1, k, k - 2]: bases without i and l
        cols = r[:, others].T.unsqueeze(2)  # [k - 1, k, 1]: r_i
        v = (cols - u @ (u.transpose(1, 2) @ cols)).squeeze(2)
        norm = torch.linalg.norm(v, dim=1, keepdim=True)
        v = torch.where(norm > tol, v / norm.clamp(min=tol), torch.zeros_like(v))
        out[left][:, others] = v.T
    return out


def clip_variance(heuristic: Tensor, cross: Tensor) -> Tensor:
    """``heuristic + cross`` clipped to ``[heuristic, MAX_INFLATION * heuristic]``.

    ``cross`` (the pair covariance term) is heavy-tailed when the sketch misses a dominant
    eigenvector (then often negative and sometimes huge, right only on average); the clip
    keeps single error bars sensible there. Measured over the test problems
    the true variance was 1.0 to 2.8 times the heuristic's, inside the clip.
    """
    return torch.minimum(torch.maximum(heuristic + cross, heuristic), MAX_INFLATION * heuristic)


def rademacher(gen: torch.Generator, dim: int, count: int) -> Tensor:
    """``[dim, count]`` Rademacher probes (entries +-1, float64), drawn column by column."""
    cols = [
        torch.randint(0, 2, (dim,), generator=gen).to(torch.float64) * 2 - 1 for _ in range(count)
    ]
    return torch.stack(cols, 1) if cols else torch.zeros(dim, 0, dtype=torch.float64)


def block_sums(x: Tensor, sizes: Sequence[int]) -> Tensor:
    """Sum ``x`` (``[D]`` or ``[D, k]``) over the rows of each block: ``[n_blocks(, k)]``."""
    index = torch.repeat_interleave(torch.arange(len(sizes)), torch.as_tensor(list(sizes)))
    out = torch.zeros((len(sizes), *x.shape[1:]), dtype=x.dtype, device=x.device)
    return out.index_add_(0, index.to(x.device), x)


def matmat(matvec: MatVec, vectors: Tensor) -> Tensor:
    """``A V`` column by column (``V``: ``[D, k]``), one product per column."""
    if vectors.shape[1] == 0:
        return torch.zeros_like(vectors)
    return torch.stack([matvec(vectors[:, j]) for j in range(vectors.shape[1])], 1)
