"""Typed per-sample gradients of one parameter, in the form a provider holds them.

A provider hands the core one :class:`PerSampleGrads` per parameter; the core derives every
per-sample statistic from it (:mod:`cockpit_core.statistics.reduce`), and quantities'
``factored_fn`` transforms receive it. ``g_n`` is always the gradient of sample ``n``'s own
loss (not scaled by ``1/B``). The forms:

* :class:`DenseGrads`: ``[B, *shape]``, already materialized;
* :class:`OuterProductGrads`: a linear layer's weight, ``g_n = sum_t d_nt a_nt^T`` with
  inputs ``a`` (``[B, in]`` or ``[B, T, in]``) and output gradients ``d``. Without a
  sequence axis the statistics follow from the factors (Goodfellow, 2015, "Efficient
  per-example gradient computations"; Dangel et al., 2020, BackPACK, Sec. 2)::

      ||g_n||^2 = ||d_n||^2 ||a_n||^2,   g_n . g_m = (d_n . d_m)(a_n . a_m),
      sum_n g_n * g_n = (d*d)^T (a*a);

  with one, norms use the ``T x T`` Gram form (Li et al., 2022, "Large language models can
  be strong differentially private learners", ghost clipping)::

      ||g_n||^2 = <A_n A_n^T, D_n D_n^T>,

  when that is cheaper than forming ``g_n`` (``T (in + out) < in out``);
* :class:`~cockpit_core.statistics.conv.ConvGrads`: a convolution's weight, ``g_n = D_n
  U_n^T`` with the unfolded input ``U_n`` (in :mod:`cockpit_core.statistics.conv`);
* :class:`~cockpit_core.statistics.embedding.EmbeddingGrads`: an embedding's weight, sparse
  rows ``g_n[v] = sum_{t: i_nt = v} d_nt`` (in :mod:`cockpit_core.statistics.embedding`).

Every form offers the same operations; those a form cannot do from its factors it does on
the materialized tensor, a block of samples at a time (:meth:`PerSampleGrads.blocks`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import Tensor

BLOCK_BYTES = 1 << 22
"""Most bytes that :meth:`PerSampleGrads.blocks` forms per block of samples (4 MiB: on the
3c3d network, forming all blocks took 0.65x the time of one whole-batch ``einsum``)."""


_HALF = (torch.float16, torch.bfloat16)


def reduction_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype statistics are computed in.

    The tensors' promoted dtype, with half precision (autocast's bf16/fp16 activations and
    gradients) raised to float32.
    """
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.float32 if dtype in _HALF else dtype


class PerSampleGrads:
    """Per-sample gradients ``g_n`` of one parameter, ``n = 1..B``.

    Attributes:
        factored: ``True`` for forms that do not hold the ``[B, *shape]`` tensor; a
            ``per_sample_transform``'s ``factored_fn`` is called only for these.
        closed_forms: Kind names this form computes without forming every element
            (``batch_l2``, ``sum_grad_squared``, ``batch_dot``, ``dot``). Others are
            computed on :meth:`blocks` or on :meth:`materialize`.

    """

    factored: ClassVar[bool] = True
    closed_forms: frozenset[str] = frozenset()

    @property
    def batch_size(self) -> int:
        """Number of samples ``B``."""
        raise NotImplementedError

    def batch_l2(self) -> Tensor:
        """``||g_n||^2``, shape ``[B]``."""
        return torch.cat([DenseGrads(b).batch_l2() for b in self.blocks()])

    def sum_grad_squared(self) -> Tensor:
        """``sum_n g_n * g_n``, parameter shape."""
        total = None
        for block in self.blocks():
            part = block.pow(2).sum(0)
            total = part if total is None else total + part
        return total  # type: ignore[return-value]

    def batch_dot(self) -> Tensor:
        """``g_n . g_m``, shape ``[B, B]``."""
        return DenseGrads(self.materialize()).batch_dot()

    def dot(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k`` for ``vectors`` of shape ``[K, *shape]``: ``[B, K]``."""
        return torch.cat([DenseGrads(b).dot(vectors) for b in self.blocks()])

    def mean(self) -> Tensor:
        """``(1/B) sum_n g_n``, parameter shape."""
        total: Tensor | None = None
        for block in self.blocks():
            part = block.sum(0)
            total = part if total is None else total + part
        if total is None:  # no blocks (an empty batch): a TypeError, as ``None / B`` was
            raise TypeError("mean() of per-sample gradients without any block of samples")
        return total / self.batch_size

    def materialize(self) -> Tensor:
        """The per-sample gradients ``[B, *shape]`` (formed once, then kept)."""
        raise NotImplementedError

    def blocks(self, max_bytes: int | None = None, keep: bool = False) -> Iterator[Tensor]:
        """The per-sample gradients of consecutive blocks of samples, ``[b, *shape]`` each.

        A block holds as many samples as fit in ``max_bytes`` (default
        :data:`BLOCK_BYTES`), at least one. If the whole tensor was formed already, it is
        the only block. ``keep`` hints that :meth:`dot` or :meth:`materialize` follow: a
        form whose closed forms are costlier than its blocks may keep them.
        """
        raise NotImplementedError

    def hold(self) -> None:
        """Keep the blocks formed from now on, if this form forms them (a hint).

        Called when several statistics read every element or project on directions during
        ``backward``; ignored by default.
        """

    def _block_size(self, max_bytes: int | None, sample_bytes: int) -> int:
        budget = BLOCK_BYTES if max_bytes is None else max_bytes
        return max(1, budget // max(sample_bytes, 1))


class DenseGrads(PerSampleGrads):
    """Per-sample gradients held as a ``[B, *shape]`` tensor."""

    factored = False
    closed_forms = frozenset({"batch_l2", "sum_grad_squared", "batch_dot", "dot"})

    def __init__(self, grads: Tensor):
        self.grads = grads.to(reduction_dtype(grads))
        self._flat = self.grads.flatten(start_dim=1)

    @property
    def batch_size(self) -> int:  # noqa: D102
        return int(self.grads.shape[0])

    def batch_l2(self) -> Tensor:  # noqa: D102
        return (self._flat**2).sum(1)

    def batch_dot(self) -> Tensor:  # noqa: D102
        return self._flat @ self._flat.T

    def sum_grad_squared(self) -> Tensor:  # noqa: D102
        return (self.grads**2).sum(0)

    def materialize(self) -> Tensor:  # noqa: D102
        return self.grads

    def blocks(self, max_bytes: int | None = None, keep: bool = False) -> Iterator[Tensor]:  # noqa: D102
        yield self.grads

    def mean(self) -> Tensor:  # noqa: D102
        return self.grads.mean(0)

    def dot(self, vectors: Tensor) -> Tensor:  # noqa: D102
        return self._flat @ vectors.reshape(vectors.shape[0], -1).to(self._flat.dtype).T


class OuterProductGrads(PerSampleGrads):
    """A linear layer's weight: ``g_n = d_n a_n^T``, or ``sum_t d_nt a_nt^T`` over a sequence.

    Args:
        inputs: Layer inputs ``a``: ``[B, in]``, or ``[B, *seq, in]`` (flattened to one
            sequence axis ``T``).
        grad_outputs: Gradients of the per-sample losses w.r.t. the outputs, ``d``, of the
            matching shape with ``out`` last.

    Attributes:
        a: The inputs (``[B, in]`` or ``[B, T, in]``).
        d: The output gradients (``[B, out]`` or ``[B, T, out]``).

    """

    def __init__(self, inputs: Tensor, grad_outputs: Tensor):
        if inputs.dim() > 3:
            inputs = inputs.reshape(inputs.shape[0], -1, inputs.shape[-1])
            grad_outputs = grad_outputs.reshape(grad_outputs.shape[0], -1, grad_outputs.shape[-1])
        dtype = reduction_dtype(inputs, grad_outputs)
        self.a = inputs.to(dtype)
        self.d = grad_outputs.to(dtype)
        self._materialized: Tensor | None = None
        self._blocks: list[Tensor] | None = None
        self._hold = False
        if not self.has_sequence:
            self.closed_forms = frozenset({"batch_l2", "sum_grad_squared", "batch_dot", "dot"})
        else:
            cheaper = {"batch_l2"} if self._gram_is_cheaper() else set()
            if self._gram_dot_is_cheaper():
                cheaper.add("batch_dot")
            self.closed_forms = frozenset({"dot", *cheaper})

    @property
    def has_sequence(self) -> bool:
        """Whether the inputs have a sequence axis (``g_n`` is a sum of outer products)."""
        return self.a.dim() == 3

    @property
    def batch_size(self) -> int:  # noqa: D102
        return int(self.d.shape[0])

    def _gram_is_cheaper(self) -> bool:
        """Norms: ``T^2 (in + out)`` per sample for the Gram form, ``T in out`` for ``g_n``."""
        t, n_in, n_out = self.a.shape[1], self.a.shape[-1], self.d.shape[-1]
        return t * (n_in + n_out) < n_in * n_out

    def _gram_dot_is_cheaper(self) -> bool:
        """Gram matrix: the Gram form costs ``B T^2 (in + out)`` per sample.

        Forming ``g_n`` costs ``T in out`` per sample and the ``B`` dot products ``B in out``.
        """
        b, t = self.a.shape[0], self.a.shape[1]
        n_in, n_out = self.a.shape[-1], self.d.shape[-1]
        return b * t * t * (n_in + n_out) < (t + b) * n_in * n_out

    def batch_l2(self) -> Tensor:
        """``||g_n||^2``: ``||d_n||^2 ||a_n||^2``, or the Gram form over the sequence.

        ``<A_n A_n^T, D_n D_n^T>`` is formed a block of samples at a time (two ``[b, T,
        T]`` Gram matrices per block).
        """
        if not self.has_sequence:
            return (self.d**2).sum(1) * (self.a**2).sum(1)
        if "batch_l2" not in self.closed_forms:
            return super().batch_l2()
        t = self.a.shape[1]
        size = self._block_size(None, 2 * t * t * self.d.element_size())
        parts = []
        for s in range(0, self.batch_size, size):
            a, d = self.a[s : s + size], self.d[s : s + size].to(self.a.dtype)
            gram_a = torch.bmm(a, a.transpose(1, 2))
            gram_d = torch.bmm(d, d.transpose(1, 2))
            parts.append((gram_a * gram_d).sum((1, 2)))
        return torch.cat(parts)

    def batch_dot(self) -> Tensor:
        """``g_n . g_m``: ``(d_n . d_m)(a_n . a_m)``, summed over both sequences.

        With a sequence axis, the ``[b T, B T]`` Gram rows of a block of samples at a time.
        """
        if not self.has_sequence:
            return (self.d @ self.d.T) * (self.a @ self.a.T)
        if "batch_dot" not in self.closed_forms:
            return super().batch_dot()
        b, t = self.a.shape[:2]
        a, d = self.a.reshape(b * t, -1), self.d.reshape(b * t, -1).to(self.a.dtype)
        size = self._block_size(None, 2 * t * b * t * self.d.element_size())
        rows = []
        for s in range(0, b, size):
            e = min(s + size, b)
            gram = (a[s * t : e * t] @ a.T) * (d[s * t : e * t] @ d.T)
            rows.append(gram.view(e - s, t, b, t).sum((1, 3)))
        return torch.cat(rows)

    def sum_grad_squared(self) -> Tensor:
        """``(d*d)^T (a*a)`` without a sequence axis; block-wise otherwise."""
        if not self.has_sequence:
            return (self.d**2).T @ (self.a**2)
        return super().sum_grad_squared()

    def hold(self) -> None:
        """Keep the blocks formed from now on: several statistics read every element.

        With a sequence axis, norms then come from the blocks too (``B in out`` more
        operations instead of the Gram form's ``B T^2 (in + out)``).
        """
        self._hold = True
        if self.has_sequence:
            self.closed_forms = self.closed_forms - {"batch_l2"}

    def materialize(self) -> Tensor:
        """``[B, out, in]`` (formed once, on first use)."""
        if self._materialized is None and self._blocks is not None:
            self._materialized, self._blocks = torch.cat(self._blocks), None
        if self._materialized is None:
            if self.has_sequence:
                self._materialized = torch.bmm(self.d.mT, self.a)  # einsum: slower, more ops
            else:
                self._materialized = self.d.unsqueeze(2) * self.a.unsqueeze(1)
        return self._materialized

    def blocks(self, max_bytes: int | None = None, keep: bool = False) -> Iterator[Tensor]:  # noqa: D102
        if self._materialized is not None:
            yield self._materialized
            return
        if self._blocks is not None:
            yield from self._blocks
            return
        n_out, n_in = self.d.shape[-1], self.a.shape[-1]
        size = self._block_size(max_bytes, n_out * n_in * self.d.element_size())
        # kept only on hold(): a deferred projection recomputes blocks from a and d, which
        # it keeps anyway, rather than holding every layer's g_n until backward ends
        kept: list[Tensor] | None = [] if self._hold else None
        for start in range(0, self.batch_size, size):
            d, a = self.d[start : start + size], self.a[start : start + size]
            if self.has_sequence:
                block = torch.bmm(d.mT, a)
            else:
                block = d.unsqueeze(2) * a.unsqueeze(1)
            if kept is not None:
                kept.append(block)
            yield block
        if kept is not None:
            self._blocks = kept

    def mean(self) -> Tensor:
        """``(1/B) sum_n g_n``, shape ``[out, in]`` (one contraction)."""
        if not self.has_sequence:
            return (self.d.T @ self.a) / self.d.shape[0]
        d, a = self.d.reshape(-1, self.d.shape[-1]), self.a.reshape(-1, self.a.shape[-1])
        return (d.T @ a) / self.batch_size

    def dot(self, vectors: Tensor) -> Tensor:
        """``sum_t d_nt^T V_k a_nt`` for ``vectors`` ``[K, out, in]``: ``[B, K]``.

        Without a sequence axis: one matrix product with the smaller intermediate, ``a x
        V^T`` when ``out <= in`` (then a contraction with ``d``), otherwise ``d x V``; the
        first is ~8x faster for a 784 -> 10 layer. With one, the same contraction costs
        ``T K in out`` per sample, forming ``g_n`` a block of samples at a time ``T in out
        + K in out``: the first for a single direction (one large matrix product instead of
        ``B`` small ones and a pass over every element of ``g_n``; 1.8x -> 1.4x plain for
        the inner-product test on the tf-small benchmark), the second for several. Blocks
        kept by :meth:`hold` cost only ``K in out``.
        """
        if self._blocks is not None or self._materialized is not None:
            return torch.cat([DenseGrads(block).dot(vectors) for block in self.blocks()])
        if self.has_sequence and vectors.shape[0] > 1:
            return torch.cat([DenseGrads(block).dot(vectors) for block in self.blocks()])
        return _outer_dot(self.a, self.d, vectors)


def _outer_dot(a: Tensor, d: Tensor, vectors: Tensor) -> Tensor:
    """``sum_t d_nt^T V_k a_nt`` (``a``, ``d`` with or without the sequence axis)."""
    k, n_out, n_in = vectors.shape[0], d.shape[-1], a.shape[-1]
    v = vectors.reshape(k * n_out, n_in).to(d.dtype)
    lead = a.shape[:-1]
    if n_out <= n_in:
        projected = (a.to(d.dtype) @ v.T).view(*lead, k, n_out) * d.unsqueeze(-2)
    else:
        v = v.view(k, n_out, n_in).permute(1, 0, 2).reshape(n_out, -1)
        projected = (d @ v).view(*lead, k, n_in) * a.unsqueeze(-2).to(d.dtype)
    out = projected.sum(-1)
    return out.sum(1) if a.dim() == 3 else out


# Names of the first release, kept for plugins written against it.
MaterializedGrads = DenseGrads
FactoredLinearGrads = OuterProductGrads


__all__ = [
    "BLOCK_BYTES",
    "DenseGrads",
    "FactoredLinearGrads",
    "MaterializedGrads",
    "OuterProductGrads",
    "PerSampleGrads",
]
