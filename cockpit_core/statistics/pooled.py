"""Per-sample gradients of several parameters of one shape, side by side.

The form in which :mod:`cockpit_core.statistics.pool` hands small parameters to a kind's
``from_pooled`` and a transform's ``pooled_fn``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class PooledGrads:
    """Per-sample gradients of ``P`` parameters of the same shape (``D`` elements), side by side.

    What a pooled statistic (a kind's ``from_pooled``, a transform's ``pooled_fn``)
    receives. It returns a tensor whose first axis runs over the ``P`` parameters, entry
    ``p`` being the value (of the same shape) the per-parameter rule gives for parameter
    ``p``.

    Attributes:
        grads: ``[P, B, D]``: ``grads[p, n]`` is sample ``n``'s gradient of parameter ``p``,
            flattened in the parameter's element order (``g_n`` of sample ``n``'s own loss,
            as :class:`~cockpit_core.statistics.per_sample.PerSampleGrads`).
        params: The ``P`` parameters, in the order of ``grads`` (computed on under
            ``torch.no_grad``).

    """

    def __init__(self, grads: Tensor, params: Sequence[Tensor]):
        self.grads = grads
        self.params = tuple(params)

    @property
    def count(self) -> int:
        """Number of parameters ``P``."""
        return int(self.grads.shape[0])

    @property
    def batch_size(self) -> int:
        """Number of samples ``B``."""
        return int(self.grads.shape[1])

    @property
    def shape(self) -> torch.Size:
        """The parameters' shape (``D`` elements)."""
        return self.params[0].shape

    def batch_l2(self) -> Tensor:
        """``||g_n||^2`` of every parameter and sample, ``[P, B]``."""
        # one reduction pass: sum(g * g) writes the squares first (~2.5x slower on the CPU)
        norms: Tensor = torch.linalg.vector_norm(self.grads, dim=-1)
        return norms.square_()

    def sum_grad_squared(self) -> Tensor:
        """``sum_n g_n * g_n`` of every parameter, ``[P, *shape]``."""
        return (self.grads * self.grads).sum(1).view(self.count, *self.shape)

    def stack(self, tensors: Sequence[Tensor]) -> Tensor:
        """One tensor per parameter (its shape, or ``[K, *shape]``) as ``[P, D]`` (``[P, K, D]``).

        In the dtype of :attr:`grads`; e.g. per-parameter directions to project on.
        """
        stacked = torch.stack(list(tensors))
        lead = stacked.dim() - self.params[0].dim()
        return stacked.reshape(*stacked.shape[:lead], -1).to(self.grads.dtype)
