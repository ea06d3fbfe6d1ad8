"""Per-sample gradients of an embedding's weight: sparse rows, never the dense tensor."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from cockpit_core.statistics.per_sample import PerSampleGrads, reduction_dtype


class EmbeddingGrads(PerSampleGrads):
    """An embedding's weight: sparse rows ``g_n[v] = sum_{t: i_nt = v} d_nt``.

    Args:
        indices: The looked-up indices ``[B, *seq]``.
        grad_outputs: Gradients of the per-sample losses w.r.t. the looked-up rows,
            ``[B, *seq, dim]``.
        num_embeddings: Rows of the weight ``V``.
        padding_idx: A row that receives no gradient (``nn.Embedding(padding_idx=...)``).

    The rows that sample ``n`` touches are summed once (``U <= B T`` rows in all); norms,
    sums of squares, Gram matrices and projections follow from them without the dense
    ``[B, V, dim]`` tensor.

    """

    closed_forms = frozenset({"batch_l2", "sum_grad_squared", "batch_dot", "dot"})

    def __init__(
        self,
        indices: Tensor,
        grad_outputs: Tensor,
        num_embeddings: int,
        padding_idx: int | None = None,
    ):
        batch = indices.shape[0]
        dim = grad_outputs.shape[-1]
        idx = indices.reshape(batch, -1)
        d = grad_outputs.reshape(batch, -1, dim).to(reduction_dtype(grad_outputs))
        sample = torch.arange(batch, device=idx.device).unsqueeze(1).expand_as(idx)
        if padding_idx is None:  # every row counts: no masked copy
            self._sum_rows(
                sample.reshape(-1), idx.reshape(-1), d.reshape(-1, dim), batch, num_embeddings
            )
            return
        keep = idx != padding_idx
        self._sum_rows(sample[keep], idx[keep], d[keep], batch, num_embeddings)

    @classmethod
    def from_rows(
        cls, sample: Tensor, index: Tensor, rows: Tensor, batch_size: int, num_embeddings: int
    ) -> EmbeddingGrads:
        """Per-sample gradients given as rows: ``g_n[index_u] += rows_u`` for ``sample_u = n``.

        Rows of the same ``(sample, index)`` are summed (e.g. the rows of two uses of one
        weight).
        """
        out = object.__new__(cls)
        out._sum_rows(sample, index, rows, batch_size, num_embeddings)
        return out

    def _sum_rows(
        self, sample: Tensor, index: Tensor, d: Tensor, batch: int, num_embeddings: int
    ) -> None:
        """Sum the rows ``d`` of equal ``(sample, index)`` once; keep the touched rows only."""
        dim = d.shape[-1]
        unique, inverse = torch.unique(sample * num_embeddings + index, return_inverse=True)
        rows = torch.zeros(len(unique), dim, dtype=d.dtype, device=d.device)
        rows.index_add_(0, inverse, d)
        self.rows = rows  # [U, dim]: the summed row of each touched (sample, index)
        self.sample = torch.div(unique, num_embeddings, rounding_mode="floor")
        self.index = unique - self.sample * num_embeddings
        self.num_embeddings = num_embeddings
        self.dim = dim
        self._batch = batch
        self._materialized: Tensor | None = None

    @property
    def batch_size(self) -> int:  # noqa: D102
        return self._batch

    def batch_l2(self) -> Tensor:  # noqa: D102
        out = torch.zeros(self._batch, dtype=self.rows.dtype, device=self.rows.device)
        return out.index_add_(0, self.sample, self.rows.pow(2).sum(1))

    def sum_grad_squared(self) -> Tensor:  # noqa: D102
        out = torch.zeros(
            self.num_embeddings, self.dim, dtype=self.rows.dtype, device=self.rows.device
        )
        return out.index_add_(0, self.index, self.rows.pow(2))

    def batch_dot(self) -> Tensor:
        """``g_n . g_m = sum_v g_n[v] . g_m[v]``: dot products of rows with the same index.

        The touched rows are grouped by index; every pair of rows within a group (``P =
        sum_v c_v^2`` pairs for ``c_v`` rows of index ``v``) contributes one dot product to
        entry ``(n, m)`` of its samples. The pairs are enumerated without a Python loop and
        reduced a block of pairs at a time.
        """
        device = self.rows.device
        out = torch.zeros(self._batch, self._batch, dtype=self.rows.dtype, device=device)
        if len(self.rows) == 0:
            return out
        order = torch.argsort(self.index, stable=True)
        rows, sample = self.rows[order], self.sample[order]
        _, counts = torch.unique_consecutive(self.index[order], return_counts=True)
        group = torch.repeat_interleave(torch.arange(len(counts), device=device), counts)
        starts = torch.cumsum(counts, 0) - counts  # first row of each group
        partners = counts[group]  # rows of its group, per row
        offsets = torch.cumsum(partners, 0) - partners
        total = int(partners.sum())
        size = self._block_size(None, 2 * self.dim * self.rows.element_size())
        for s in range(0, total, size):
            pair = torch.arange(s, min(s + size, total), device=device)
            first = torch.searchsorted(offsets, pair, right=True) - 1
            second = starts[group[first]] + (pair - offsets[first])
            values = (rows[first] * rows[second]).sum(1)
            out.index_put_((sample[first], sample[second]), values, accumulate=True)
        return out

    def dot(self, vectors: Tensor) -> Tensor:  # noqa: D102
        picked = vectors[:, self.index, :].to(self.rows.dtype)  # [K, U, dim]
        per_row = (picked * self.rows.unsqueeze(0)).sum(-1).T  # [U, K]
        out = torch.zeros(self._batch, vectors.shape[0], dtype=per_row.dtype, device=per_row.device)
        return out.index_add_(0, self.sample, per_row)

    def mean(self) -> Tensor:  # noqa: D102
        out = torch.zeros(
            self.num_embeddings, self.dim, dtype=self.rows.dtype, device=self.rows.device
        )
        return out.index_add_(0, self.index, self.rows) / self._batch

    def _dense(self, start: int, stop: int) -> Tensor:
        stop = min(stop, self._batch)
        out = torch.zeros(
            stop - start,
            self.num_embeddings,
            self.dim,
            dtype=self.rows.dtype,
            device=self.rows.device,
        )
        chosen = (self.sample >= start) & (self.sample < stop)
        out[self.sample[chosen] - start, self.index[chosen]] = self.rows[chosen]
        return out

    def materialize(self) -> Tensor:
        """``[B, V, dim]`` (formed once, on first use; mostly zeros)."""
        if self._materialized is None:
            self._materialized = self._dense(0, self._batch)
        return self._materialized

    def blocks(self, max_bytes: int | None = None, keep: bool = False) -> Iterator[Tensor]:  # noqa: D102
        if self._materialized is not None:
            yield self._materialized
            return
        size = self._block_size(
            max_bytes, self.num_embeddings * self.dim * self.rows.element_size()
        )
        for start in range(0, self._batch, size):
            yield self._dense(start, start + size)
