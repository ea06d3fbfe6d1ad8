"""Per-sample gradients of a parameter with several uses (tied weights): ``g_n = sum_i g_n^(i)``.

A parameter registered by several modules (a language model's token embedding reused as its
output head, ``lm_head.weight is wte.weight``) gets one per-sample gradient from each use,
in the form of that use's rule (sparse embedding rows, a linear layer's factors, ...). Its
per-sample gradient is their sum, so every statistic that is not linear in ``g_n`` needs the
cross terms between the uses::

    ||g_n||^2 = sum_i ||g_n^(i)||^2 + 2 sum_{i<j} <g_n^(i), g_n^(j)>,
    g_n . g_m = sum_{i,j} <g_n^(i), g_m^(j)>,
    sum_n g_n * g_n = sum_i sum_n g_n^(i) * g_n^(i) + 2 sum_{i<j} sum_n g_n^(i) * g_n^(j).

:class:`TiedGrads` first merges parts of the same form (two linear uses are one factored
gradient over the concatenated sequence; two embedding uses one set of rows), then keeps
the closed forms its parts have when a closed cross term is known for every pair. The one
known here is the tied embedding and output head: with embedding rows ``r_u`` (sample
``s_u``, row ``v_u``) and the head's factors ``g_n = sum_t d_nt a_nt^T``, the head's
gradient restricted to row ``v`` is ``sum_t d_nt[v] a_nt``, so

    <E_n, O_m> = sum_{u: s_u = n} sum_t d_mt[v_u] (r_u . a_mt),

which touches only the rows a sample looked up (Goodfellow, 2015, "Efficient per-example
gradient computations", for the factored form). Other statistics, and pairs without a
closed cross term, form ``g_n`` a block of samples at a time from the parts' blocks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from cockpit_core.statistics.embedding import EmbeddingGrads
from cockpit_core.statistics.per_sample import DenseGrads, OuterProductGrads, PerSampleGrads

_PAIRED = frozenset({"batch_l2", "sum_grad_squared", "batch_dot"})
"""Kinds whose value needs the cross terms of every pair of uses."""


class TiedGrads(PerSampleGrads):
    """The per-sample gradients of a parameter with several uses: ``g_n = sum_i g_n^(i)``.

    Args:
        parts: One per-sample gradient per use (at least one), all of the parameter's
            shape and the same samples.

    """

    def __init__(self, parts: Sequence[PerSampleGrads]):
        if not parts:
            raise ValueError("TiedGrads needs at least one part")
        self.parts = merge_parts(parts)
        self._materialized: Tensor | None = None
        closed = {"dot"}
        for kind in _PAIRED:
            if all(kind in p.closed_forms for p in self.parts) and all(
                _cross_of(a, b) is not None for a, b in self._pairs()
            ):
                closed.add(kind)
        self.closed_forms = frozenset(closed)

    def _pairs(self) -> Iterator[tuple[PerSampleGrads, PerSampleGrads]]:
        for i, a in enumerate(self.parts):
            for b in self.parts[i + 1 :]:
                yield a, b

    @property
    def batch_size(self) -> int:  # noqa: D102
        return self.parts[0].batch_size

    def batch_l2(self) -> Tensor:  # noqa: D102
        if "batch_l2" not in self.closed_forms:
            return super().batch_l2()
        total = sum(p.batch_l2() for p in self.parts)
        for a, b in self._pairs():
            total = total + 2 * _cross(a, b).l2()
        return total  # type: ignore[return-value]

    def batch_dot(self) -> Tensor:  # noqa: D102
        if "batch_dot" not in self.closed_forms:
            return super().batch_dot()
        total = sum(p.batch_dot() for p in self.parts)
        for a, b in self._pairs():
            cross = _cross(a, b).dot_matrix()
            total = total + cross + cross.T
        return total  # type: ignore[return-value]

    def sum_grad_squared(self) -> Tensor:  # noqa: D102
        if "sum_grad_squared" not in self.closed_forms:
            return super().sum_grad_squared()
        total = sum(p.sum_grad_squared() for p in self.parts)
        for a, b in self._pairs():
            total = total + 2 * _cross(a, b).products()
        return total  # type: ignore[return-value]

    def dot(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k``: linear in ``g_n``, the sum of every part's projection."""
        return sum(p.dot(vectors) for p in self.parts)  # type: ignore[return-value]

    def mean(self) -> Tensor:  # noqa: D102
        return sum(p.mean() for p in self.parts)  # type: ignore[return-value]

    def materialize(self) -> Tensor:
        """``[B, *shape]``, the sum of the parts' tensors (formed once)."""
        if self._materialized is None:
            self._materialized = torch.cat(list(self.blocks()))
        return self._materialized

    def blocks(self, max_bytes: int | None = None, keep: bool = False) -> Iterator[Tensor]:
        """Blocks of ``sum_i g_n^(i)``: the parts' blocks, re-cut to the same samples."""
        if self._materialized is not None:
            yield self._materialized
            return
        first, *rest = self.parts
        streams = [_Rechunk(p.blocks(max_bytes)) for p in rest]
        for block in first.blocks(max_bytes):  # the other parts cut to its blocks' samples
            total = block
            for stream in streams:
                total = total + stream.take(len(block))
            yield total


class _Rechunk:
    """Cuts a stream of sample blocks into blocks of requested sizes."""

    def __init__(self, blocks: Iterator[Tensor]):
        self._blocks = blocks
        self._rest: Tensor | None = None

    def take(self, count: int) -> Tensor:
        pieces = []
        while count > 0:
            if self._rest is None or len(self._rest) == 0:
                self._rest = next(self._blocks)
            piece, self._rest = self._rest[:count], self._rest[count:]
            pieces.append(piece)
            count -= len(piece)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def merge_parts(parts: Sequence[PerSampleGrads]) -> list[PerSampleGrads]:
    """Parts of the same form merged into one: fewer pairs, and each keeps its closed forms.

    Linear uses concatenate their sequences (``sum_t`` over both), embedding uses their
    rows; dense parts add up, and absorb any part that has no merge rule with another.
    """
    outers = [p for p in parts if isinstance(p, OuterProductGrads)]
    embeddings = [p for p in parts if isinstance(p, EmbeddingGrads)]
    dense = [p for p in parts if isinstance(p, DenseGrads)]
    others = [p for p in parts if p not in outers and p not in embeddings and p not in dense]
    merged: list[PerSampleGrads] = []
    if outers:
        merged.append(outers[0] if len(outers) == 1 else _merge_outer(outers))
    if embeddings:
        merged.append(embeddings[0] if len(embeddings) == 1 else _merge_embedding(embeddings))
    merged.extend(others)
    if dense:
        total = sum(p.grads for p in dense)
        merged.append(DenseGrads(total))  # type: ignore[arg-type]
    return merged


def _merge_outer(parts: list[OuterProductGrads]) -> OuterProductGrads:
    """``sum_t d_nt a_nt^T`` over the uses' sequences, concatenated."""

    def seq(t: Tensor) -> Tensor:
        return t.unsqueeze(1) if t.dim() == 2 else t

    a = torch.cat([seq(p.a) for p in parts], dim=1)
    d = torch.cat([seq(p.d).to(a.dtype) for p in parts], dim=1)
    return OuterProductGrads(a, d)


def _merge_embedding(parts: list[EmbeddingGrads]) -> EmbeddingGrads:
    """The touched rows of every use, summed per ``(sample, row)``."""
    first = parts[0]
    return EmbeddingGrads.from_rows(
        torch.cat([p.sample for p in parts]),
        torch.cat([p.index for p in parts]),
        torch.cat([p.rows for p in parts]),
        first.batch_size,
        first.num_embeddings,
    )


class _Cross:
    """The cross terms ``<g_n^(a), g_m^(b)>`` of two uses (a closed form for one pair of forms)."""

    def l2(self) -> Tensor:
        """``<g_n^(a), g_n^(b)>``, ``[B]``."""
        raise NotImplementedError

    def dot_matrix(self) -> Tensor:
        """``<g_n^(a), g_m^(b)>``, ``[B, B]`` (row ``n`` from ``a``)."""
        raise NotImplementedError

    def products(self) -> Tensor:
        """``sum_n g_n^(a) * g_n^(b)``, parameter shape."""
        raise NotImplementedError


class _EmbeddingHead(_Cross):
    """A tied embedding (rows ``r_u`` of sample ``s_u``, row ``v_u``) and linear head.

    The head's ``g_m = sum_t d_mt a_mt^T`` has rows ``d`` (``[B, T, V]``) and columns ``a``
    (``[B, T, dim]``); only the rows the embedding touched meet it. Formed a block of
    touched rows at a time.
    """

    def __init__(self, embedding: EmbeddingGrads, head: OuterProductGrads):
        self.e = embedding
        self.a = head.a if head.a.dim() == 3 else head.a.unsqueeze(1)
        self.d = head.d if head.d.dim() == 3 else head.d.unsqueeze(1)
        self.dtype = torch.promote_types(self.a.dtype, embedding.rows.dtype)

    def _chunks(self, per_row: int) -> Iterator[slice]:
        size = max(1, (1 << 22) // max(per_row * 8, 1))
        for start in range(0, len(self.e.rows), size):
            yield slice(start, start + size)

    def _own(self, rows: slice) -> tuple[Tensor, Tensor, Tensor]:
        """``d_nt[v_u]`` ``[U, T]``, ``a_nt`` ``[U, T, dim]`` of each row's own sample, ``r_u``."""
        s, v = self.e.sample[rows], self.e.index[rows]
        d = self.d[s, :, v].to(self.dtype)
        return d, self.a[s].to(self.dtype), self.e.rows[rows].to(self.dtype)

    def l2(self) -> Tensor:  # noqa: D102
        out = torch.zeros(self.e.batch_size, dtype=self.dtype, device=self.a.device)
        for rows in self._chunks(self.a.shape[1] * self.a.shape[2]):
            d, a, r = self._own(rows)
            out.index_add_(0, self.e.sample[rows], torch.einsum("ut,utk,uk->u", d, a, r))
        return out

    def products(self) -> Tensor:  # noqa: D102
        out = torch.zeros(self.e.num_embeddings, self.e.dim, dtype=self.dtype, device=self.a.device)
        for rows in self._chunks(self.a.shape[1] * self.a.shape[2]):
            d, a, r = self._own(rows)
            out.index_add_(0, self.e.index[rows], r * torch.einsum("ut,utk->uk", d, a))
        return out

    def dot_matrix(self) -> Tensor:  # noqa: D102
        batch, length = self.a.shape[0], self.a.shape[1]
        out = torch.zeros(batch, batch, dtype=self.dtype, device=self.a.device)
        a = self.a.to(self.dtype)
        for rows in self._chunks(batch * length):
            v, r = self.e.index[rows], self.e.rows[rows].to(self.dtype)
            d = self.d[:, :, v].to(self.dtype)  # [B, T, U]: every sample m at row v_u
            ar = a @ r.T  # [B, T, U]: a_mt . r_u
            per_row = (d * ar).sum(1)  # [B, U]: <E-row u, O_m>
            out.index_add_(0, self.e.sample[rows], per_row.T)
        return out


def _cross_of(a: PerSampleGrads, b: PerSampleGrads) -> _Cross | None:
    """The closed cross terms of two forms (``a``'s samples as rows), if one is known."""
    if isinstance(a, EmbeddingGrads) and isinstance(b, OuterProductGrads):
        return _EmbeddingHead(a, b)
    if isinstance(a, OuterProductGrads) and isinstance(b, EmbeddingGrads):
        return _Transposed(_EmbeddingHead(b, a))
    return None


class _Transposed(_Cross):
    """The cross terms with the roles of the two uses swapped."""

    def __init__(self, inner: _Cross):
        self.inner = inner

    def l2(self) -> Tensor:  # noqa: D102
        return self.inner.l2()

    def dot_matrix(self) -> Tensor:  # noqa: D102
        return self.inner.dot_matrix().T

    def products(self) -> Tensor:  # noqa: D102
        return self.inner.products()


def _cross(a: PerSampleGrads, b: PerSampleGrads) -> _Cross:
    cross = _cross_of(a, b)
    assert cross is not None  # closed_forms holds only kinds with a cross term for every pair
    return cross
