"""Common pieces of the trace and diagonal estimators: result types, probes, per-block sums."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

MatVec = Callable[[Tensor], Tensor]
"""``v -> A v`` for a flat float64 vector ``v`` of length ``D`` (one product per call)."""


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

    """

    samples: Tensor
    hvps: int

    @property
    def diagonal(self) -> Tensor:
        """``[D]`` estimate of ``diag(A)``: the mean of the samples."""
        return self.samples.mean(0)

    @property
    def std_error(self) -> Tensor:
        """``[D]`` per-entry ``std(samples, ddof=1) / sqrt(n)`` (NaN if ``n < 2``)."""
        return self.std_error_of(None)

    def std_error_of(self, weights: Tensor | None, sizes: Sequence[int] | None = None) -> Tensor:
        """Standard error of ``w^T d`` (``d`` the estimate), or of each block's part of it.

        Args:
            weights: ``[D]`` weights ``w``; ``None`` for the per-entry errors (``[D]``).
            sizes: Entries of each block: return ``[n_blocks]`` errors of
                ``sum_{j in b} w_j d_j``; ``None``: one error of ``w^T d`` (a 0-d tensor).

        Returns:
            ``std`` over the ``n`` samples of the same function of each sample, over
            ``sqrt(n)``; NaN with fewer than two samples.

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
        return values.std(0, correction=1) / math.sqrt(n)


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
