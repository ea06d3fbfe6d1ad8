"""Per-sample gradients of one parameter, materialized or in factored form.

For a linear layer ``y = W a + b`` the per-sample gradients are outer products,
``g_n(W) = d_n a_n^T`` and ``g_n(b) = d_n`` with ``d_n = dl_n/dy_n``. Their norms, dot products
and sums of squares follow from the factors without forming the ``B x out x in`` tensor
(Dangel et al., 2020, BackPACK, Sec. 2; Goodfellow, 2015, "Efficient per-example gradient
computations"):

    ||g_n||^2 = ||d_n||^2 ||a_n||^2,   g_n . g_m = (d_n . d_m)(a_n . a_m),
    sum_n g_n * g_n = (d*d)^T (a*a).

Projections on a few directions ``V_k`` (``[K, *shape]``) never need the per-sample tensor
either: ``g_n . V = d_n^T V a_n`` for a linear layer, and for a convolution
``g_n . V = sum D_n * conv(X_n, V)`` (one convolution with the directions as kernels).

A Conv2d weight's per-sample tensor ``[B, C_out, C_in, k_h, k_w]`` has no such shortcut,
but statistics that are sums or concatenations over samples can be taken from it a block
of samples at a time (:meth:`ConvGrads.blocks`), without the whole-batch intermediates.

Every statistic is computed the same way whatever other statistics are requested (up to
float rounding of sums over blocks), so a value does not depend on which quantities share
the step. The factored classes (``factored = True``) are what
``per_sample_transform(..., factored_fn=...)`` receives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

BLOCK_BYTES = 1 << 22
"""Most bytes that :meth:`ConvGrads.blocks` forms per block of samples (4 MiB: on the 3c3d
network, forming all blocks took 0.65x the time of one whole-batch ``einsum``)."""


class MaterializedGrads:
    """Per-sample gradients held as a ``[B, *shape]`` tensor."""

    factored = False

    def __init__(self, grads: Tensor):
        self.grads = grads
        self._flat = grads.flatten(start_dim=1)

    def batch_l2(self) -> Tensor:
        """``||g_n||^2``, shape ``[B]``."""
        return (self._flat**2).sum(1)

    def batch_dot(self) -> Tensor:
        """``g_n . g_m``, shape ``[B, B]``."""
        return self._flat @ self._flat.T

    def sum_grad_squared(self) -> Tensor:
        """``sum_n g_n * g_n``, parameter shape."""
        return (self.grads**2).sum(0)

    def materialize(self) -> Tensor:
        """The per-sample gradients, ``[B, *shape]``."""
        return self.grads

    def mean(self) -> Tensor:
        """``(1/B) sum_n g_n``, parameter shape."""
        return self.grads.mean(0)

    def dot(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k`` for ``vectors`` ``[K, *shape]``, shape ``[B, K]``."""
        return self._flat @ vectors.reshape(vectors.shape[0], -1).to(self._flat.dtype).T


class FactoredLinearGrads:
    """Per-sample gradients of a linear layer's weight, ``g_n = d_n a_n^T``.

    Args:
        inputs: Layer inputs ``a``, shape ``[B, in]``.
        grad_outputs: Gradients of the per-sample losses w.r.t. the outputs, ``[B, out]``.

    """

    factored = True

    def __init__(self, inputs: Tensor, grad_outputs: Tensor):
        self.a = inputs
        self.d = grad_outputs
        self._materialized: Tensor | None = None

    def batch_l2(self) -> Tensor:
        """``||d_n||^2 ||a_n||^2``."""
        return (self.d**2).sum(1) * (self.a**2).sum(1)

    def batch_dot(self) -> Tensor:
        """``(d_n . d_m)(a_n . a_m)``."""
        return (self.d @ self.d.T) * (self.a @ self.a.T)

    def sum_grad_squared(self) -> Tensor:
        """``(d*d)^T (a*a)``, shape ``[out, in]``."""
        return (self.d**2).T @ (self.a**2)

    def materialize(self) -> Tensor:
        """``d_n a_n^T``, shape ``[B, out, in]`` (formed once, on first use)."""
        if self._materialized is None:
            self._materialized = self.d.unsqueeze(2) * self.a.unsqueeze(1)
        return self._materialized

    def mean(self) -> Tensor:
        """``(1/B) d^T a``, shape ``[out, in]``."""
        return (self.d.T @ self.a) / self.d.shape[0]

    def dot(self, vectors: Tensor) -> Tensor:
        """``d_n^T V_k a_n`` for ``vectors`` ``[K, out, in]``, shape ``[B, K]``.

        One matrix product with the smaller intermediate: ``a [B, in] x V^T [in, K out]``
        when ``out <= in`` (then a ``[B, K, out]`` contraction with ``d``), otherwise
        ``d [B, out] x [out, K in]``. The first is ~8x faster for a 784 -> 10 layer.
        """
        k, n_out, n_in = vectors.shape[0], self.d.shape[1], self.a.shape[1]
        v = vectors.reshape(k * n_out, n_in).to(self.d.dtype)
        if n_out <= n_in:
            return ((self.a.to(self.d.dtype) @ v.T).view(-1, k, n_out) * self.d[:, None, :]).sum(-1)
        v = v.view(k, n_out, n_in).permute(1, 0, 2).reshape(n_out, -1)
        return ((self.d @ v).view(-1, k, n_in) * self.a[:, None, :].to(self.d.dtype)).sum(-1)


class ConvGrads:
    """Per-sample gradients of a Conv2d weight, ``g_n = D_n U_n^T``, formed only on demand.

    Args:
        factors: Holds the padded input and the output gradient of each sample's own loss
            (:class:`~cockpit_core.backends.conv_grads.ConvWeightFactors`).

    """

    factored = True

    def __init__(self, factors: Any):
        self.factors = factors
        self._grads: MaterializedGrads | None = None
        self._blocks: list[Tensor] | None = None

    def _materialized(self) -> MaterializedGrads:
        if self._grads is None:
            kept, self._blocks = self._blocks, None
            whole = torch.cat(kept) if kept else self.factors.materialize()
            self._grads = MaterializedGrads(whole)
            self.factors = None  # not needed any more: frees the scaled output gradient
        return self._grads

    def batch_l2(self) -> Tensor:
        """``||g_n||^2``, shape ``[B]``."""
        return self._materialized().batch_l2()

    def batch_dot(self) -> Tensor:
        """``g_n . g_m``, shape ``[B, B]``."""
        return self._materialized().batch_dot()

    def sum_grad_squared(self) -> Tensor:
        """``sum_n g_n * g_n``, parameter shape."""
        return self._materialized().sum_grad_squared()

    def materialize(self) -> Tensor:
        """``[B, C_out, C_in, k_h, k_w]`` (formed once, on first use)."""
        return self._materialized().grads

    def blocks(self, max_bytes: int | None = None, keep: bool = False) -> Iterator[Tensor]:
        """The per-sample gradients of consecutive blocks of samples, ``[b, *shape]`` each.

        A block holds as many samples as fit in ``max_bytes`` (default :data:`BLOCK_BYTES`;
        with their patches, see
        :meth:`~cockpit_core.backends.conv_grads.ConvWeightFactors.sample_bytes`), at least
        one. With ``keep``, the blocks are kept for :meth:`dot` (projections after
        backward then need no convolution). If the whole tensor was formed already, it is
        the only block. Statistics that are sums over samples are sums over the blocks.
        """
        if self._grads is not None or self._blocks is not None:
            yield from [self._grads.grads] if self._grads is not None else self._blocks
            return
        batch = self.factors.grad_outputs.shape[0]
        budget = BLOCK_BYTES if max_bytes is None else max_bytes
        size = max(1, budget // max(self.factors.sample_bytes(), 1))
        kept = []
        for start in range(0, max(batch, 1), size):
            block = self.factors.materialize(start, start + size)
            if keep:
                kept.append(block)
            yield block
        if keep:
            self._blocks, self.factors = kept, None

    def mean(self) -> Tensor:
        """``(1/B) sum_n g_n``, without the per-sample tensor unless it exists already."""
        if self._grads is not None:
            return self._grads.mean()
        if self._blocks is not None:
            total = sum(block.shape[0] for block in self._blocks)
            return torch.stack([block.sum(0) for block in self._blocks]).sum(0) / total
        return self.factors.summed() / self.factors.grad_outputs.shape[0]

    def dot(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k``, ``[B, K]``: from the per-sample gradients if formed, else by convolution."""
        if self._grads is not None:
            return self._grads.dot(vectors)
        if self._blocks is not None:
            return torch.cat([MaterializedGrads(block).dot(vectors) for block in self._blocks])
        return self.factors.dot(vectors, BLOCK_BYTES)
