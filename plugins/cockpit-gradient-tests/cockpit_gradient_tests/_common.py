"""Helpers shared by the gradient-statistics quantities.

Every quantity of this plugin reduces per-sample statistics to a handful of numbers per
parameter. The reductions run in float64 (they are tiny: ``[B]``, ``[B, B]`` or one number
per parameter), so the only rounding left is the one in the statistics themselves.

They take a fixed number of tensor operations for the whole model, not a few per parameter
(on small models each operation's dispatch costs more than its arithmetic): the ``[B]``
statistics of all parameters are stacked into one ``[P, B]`` tensor, the gradient norms
come from one ``torch._foreach_norm``, and element-wise statistics are stacked once per
distinct parameter shape (:class:`ShapeGroups`) and processed with ``torch._foreach_*``.

Notation (also used in the docstrings of the quantities): ``g_n`` is the gradient of sample
``n``'s own loss, ``g = (1/B) sum_n g_n`` the mini-batch gradient (``p.grad``), ``B`` the
batch size, ``D`` the number of parameter entries. A subscript ``p`` restricts a vector to
the entries of one parameter (one "layer" of the per-parameter breakdown).

Under FSDP2 (``fully_shard``) the quantities declare ``shards = True``: ``ctx.grads`` and
``SUM_GRAD_SQUARED`` hold this process's rows, and every sum over a parameter's entries
(:func:`squared_norms`, :meth:`ShapeGroups.sums`, the entry counts) is summed over the
processes with :func:`~cockpit_core.shard_sum` (a no-op elsewhere). The per-sample
statistics (``[B]`` rows) are the global batch's already.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core import (
    BATCH_L2,
    BATCH_PROJECTION,
    SUM_GRAD_SQUARED,
    MisuseError,
    Statistic,
    StepContext,
    shard_sum,
)


def require_samples(name: str, batch_size: int, minimum: int = 2) -> None:
    """Raise :class:`MisuseError` if the batch is too small for a sample variance."""
    if batch_size < minimum:
        raise MisuseError(
            f"'{name}' needs at least {minimum} samples per mini-batch (got {batch_size}): "
            "it estimates a sample variance over the batch. Use a larger batch, or do not "
            "track this quantity."
        )


@torch.no_grad()
def per_sample64(ctx: StepContext, statistic: Statistic, name: str) -> Tensor:
    """A per-sample statistic (``[B]`` per parameter) as one float64 ``[P, B]`` tensor.

    One ``torch.stack`` and one conversion for all parameters, once per step for all the
    quantities that ask (the tensor is shared: do not modify it in place). Rows of
    parameters that received no gradient are zero. ``B`` is the statistics' length (``ctx.batch_size`` if no
    parameter has one).

    Raises:
        MisuseError: ``B < 2``: the quantities estimate a sample variance.

    """
    # the tests of a step read the same statistics: stacked once (ctx.shared)
    key = f"cockpit_gradient_tests.per_sample64{statistic.identity}"
    return ctx.shared(key, lambda: _per_sample64(ctx, statistic, name))


def _per_sample64(ctx: StepContext, statistic: Statistic, name: str) -> Tensor:
    values: list[Tensor | None] = list(ctx.stat(statistic))
    rows = [v for v in values if v is not None]
    batch_size = int(rows[0].shape[0]) if rows else ctx.batch_size
    require_samples(name, batch_size)
    if len(rows) < len(values):
        zeros = torch.zeros(batch_size, dtype=torch.float64, device=ctx.grads[0].device)
        rows = [zeros if v is None else v for v in values]
    return torch.stack(rows).double()


def squared_norms(tensors: Sequence[Tensor]) -> Tensor:
    """``[||t_i||^2]``, accumulated in float64, with one ``torch._foreach_norm`` for all tensors.

    Rounding: torch's CPU norm kernel accumulates sequentially, a relative error of about
    ``1e-16 sqrt(n)`` for ``n`` entries (``1e-13`` for a million; a pairwise ``sum`` stays
    near ``1e-16``). That is float64 rounding all the same, far below the float32 rounding of
    the per-sample statistics of float32 models these norms are compared with. Under
    FSDP2 the tensors are this process's rows: the squares are summed over the processes.
    """
    return shard_sum(torch.stack(torch._foreach_norm(list(tensors), 2, dtype=torch.float64)).pow(2))


def grad_squared_norms(ctx: StepContext) -> Tensor:
    """:func:`squared_norms` of the mini-batch gradients, once per step for all quantities."""
    return ctx.shared("cockpit_gradient_tests.grad_sq", lambda: squared_norms(ctx.grads))


def gram_reductions(ctx: StepContext, name: str) -> tuple[int, Tensor, Tensor, Tensor]:
    """Per-parameter projections on the mini-batch gradient (``BATCH_PROJECTION``, ``BATCH_L2``).

    The projections ``g_{n,p} . g_p`` equal the row sums ``(1/B) sum_m G_p[n, m]`` of the
    per-sample Gram matrices, but cost ``O(B D)`` instead of ``O(B^2 D)`` and, unlike the
    Gram matrix, combine exactly across ``torch.distributed`` processes.

    Returns:
        ``(B, proj, sum_sq, grad_sq)``: ``proj[p, n] = g_{n,p} . g_p``, the projection of each
        sample's gradient on the mini-batch gradient; ``sum_sq[p] = sum_n ||g_{n,p}||^2``;
        ``grad_sq[p] = ||g_p||^2`` from ``p.grad`` (shared tensors: do not modify them
        in place).

    """
    proj = per_sample64(ctx, BATCH_PROJECTION, name)
    sum_sq = per_sample64(ctx, BATCH_L2, name).sum(1)
    return proj.shape[1], proj, sum_sq, grad_squared_norms(ctx)


class ShapeGroups:
    """The parameters grouped by shape (and device), to stack each group into one tensor.

    Element-wise statistics then take one operation per group (a handful for a transformer
    of any depth) instead of one per parameter.

    Attributes:
        indices: The parameter indices of each group, in order of first appearance.
        numel: The number of entries of each parameter here (this process's rows under
            FSDP2), in parameter order.

    """

    def __init__(self, tensors: Sequence[Tensor]):
        groups: dict[tuple[torch.Size, torch.device], list[int]] = {}
        for i, t in enumerate(tensors):
            groups.setdefault((t.shape, t.device), []).append(i)
        self.indices = list(groups.values())
        self.numel = [t.numel() for t in tensors]
        # where each parameter lands when the groups are concatenated
        order = [i for index in self.indices for i in index]
        self._position = sorted(range(len(order)), key=order.__getitem__)

    def stack64(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """One float64 ``[k, *shape]`` tensor per group of ``tensors`` (in parameter order)."""
        return [torch.stack([tensors[i] for i in index]).double() for index in self.indices]

    def sums(self, stacks: Sequence[Tensor]) -> Tensor:
        """The sum of each parameter's entries in ``stacks`` (from :meth:`stack64`), ``[P]``.

        Over all processes' rows under FSDP2 (one :func:`~cockpit_core.shard_sum`).
        """
        return shard_sum(self._local_sums(stacks))

    def means(self, stacks: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """``(sums, counts)``: :meth:`sums` and each parameter's number of entries, ``[P]``.

        Both over all processes' rows under FSDP2, in one :func:`~cockpit_core.shard_sum`.
        """
        sums = self._local_sums(stacks)
        both = shard_sum(torch.stack([sums, sums.new_tensor(self.numel)]))
        return both[0], both[1]

    def _local_sums(self, stacks: Sequence[Tensor]) -> Tensor:
        sums = torch.cat([s.reshape(len(s), math.prod(s.shape[1:])).sum(1) for s in stacks])
        return sums[torch.tensor(self._position, device=sums.device)]


@torch.no_grad()
def elementwise_variances(
    ctx: StepContext, name: str, unbiased: bool
) -> tuple[int, ShapeGroups, list[Tensor], list[Tensor]]:
    """Per-entry gradient variances from ``SUM_GRAD_SQUARED``, stacked by parameter shape.

    Args:
        ctx: The step context.
        name: Output key of the quantity (for error messages).
        unbiased: Divide by ``B - 1`` (sample variance) instead of ``B`` (population).

    Returns:
        ``(B, groups, grad_sq, var)`` with, per group of :class:`ShapeGroups` (float64
        ``[k, *shape]``), ``grad_sq = g^2`` and
        ``var = max(0, sum_n g_n^2 - B g^2) / (B - 1 or B)`` entry-wise. The clamp only
        removes negative values that rounding can produce. ``groups.sums`` reduces them to
        one value per parameter.

    """
    batch_size = ctx.batch_size
    require_samples(name, batch_size, minimum=2 if unbiased else 1)
    grads = ctx.grads
    sgs = [
        torch.zeros_like(g) if s is None else s for s, g in zip(ctx.stat(SUM_GRAD_SQUARED), grads)
    ]
    groups = ShapeGroups(grads)
    grad_sq = list(torch._foreach_pow(groups.stack64(grads), 2))
    var = list(torch._foreach_sub(groups.stack64(sgs), torch._foreach_mul(grad_sq, batch_size)))
    torch._foreach_clamp_min_(var, 0.0)
    torch._foreach_div_(var, batch_size - 1 if unbiased else batch_size)
    return batch_size, groups, grad_sq, var


def epsilon_field_description(what: str) -> str:
    """Description of the ``epsilon`` option (shared by mean GSNR and early stopping)."""
    return (
        f"Added to the variance in the denominator of {what} to avoid division by zero "
        "(absolute, so it depends on the scale of the gradients). Cockpit 1.0.2 default: 1e-5."
    )
