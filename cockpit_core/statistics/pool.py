"""Per-sample statistics of many small parameters at once, one batched operation per statistic.

On the models people train, most parameters are small (norm weights, biases, the
projections of a narrow transformer). For them, computing each statistic of each parameter
on its own costs the fixed dispatch overhead of a few tensor operations (3-10 µs each on a
CPU), not arithmetic: a tracked ``economy`` step of a 2-layer GPT-2 issued ~4,500 tensor
operations against ~350 of the plain step (``benchmarks/op_counts.py``).

So :meth:`Collection.deliver <cockpit_core.statistics.provider.Collection.deliver>` does not
reduce a small parameter at once: it forms its per-sample gradients and holds them in a
:class:`Pool` of parameters with the same shape. When the pools hold more than
:data:`POOL_BYTES`, and when ``backward`` ends, each pool is stacked into one ``[P, B, D]``
tensor (a :class:`~cockpit_core.statistics.pooled.PooledGrads`) and every statistic is computed for its ``P`` parameters by
the same few batched operations, e.g. ``||g_n||^2`` of all of them as one
``(G * G).sum(-1)``. Transformer layers repeat their shapes, so a deep model has no more
pools than a shallow one.

A statistic is pooled when its kind says how (``from_pooled``, which a transform provides
through its ``pooled_fn``); a parameter is pooled only if every statistic wanted of it is,
and its per-sample gradients take at most :data:`MEMBER_BYTES`. Projections formed after
``backward`` (under ``torch.distributed`` or gradient accumulation) are not pooled: the
parameter's compact form is kept for them. The values equal those of
:func:`~cockpit_core.statistics.reduce.reduce_per_sample` up to rounding; on the small
models of ``benchmarks/real_models.py`` a tracked step took 25-44% less time
(``benchmarks/results/pooling.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from cockpit_core.statistics.per_sample import DenseGrads, PerSampleGrads
from cockpit_core.statistics.pooled import PooledGrads
from cockpit_core.statistics.projection import directions
from cockpit_core.statistics.reduce import FAILED, attempt

MEMBER_BYTES = 1 << 19
"""Largest per-sample gradients (bytes, ``B x D``) of a parameter that is pooled (512 KiB).
Above this, forming ``g_n`` where a factored closed form would do costs more than the
dispatch overhead pooling saves: with 1 MiB, the ``tf-small`` benchmark's ``economy``
(``[32, 8192]`` layers) was ~10% slower than reducing those layers one by one."""

POOL_BYTES = 1 << 23
"""Per-sample gradients (bytes) held in pools before they are reduced (8 MiB)."""

Identity = tuple[str, str]


@dataclass
class Pool:
    """Parameters waiting to be reduced together: same shape, dtype, device, batch, statistics."""

    stats: tuple[Any, ...]
    indices: list[int] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    params: list[Tensor] = field(default_factory=list)
    finals: list[Callable[[], Tensor]] = field(default_factory=list)


def poolable(stat: Any, projects_now: bool) -> bool:
    """Whether ``stat`` can be computed for a pool of parameters.

    ``projects_now``: whether projections are formed during ``backward`` (the final
    gradient is known); deferred projections keep each parameter's own compact form.
    """
    if stat.combine == "project":
        return projects_now
    kind = stat.kind
    if getattr(kind, "from_pooled", None) is None:
        return False
    return kind != "transform" or stat.pooled_fn is not None


def member_grads(grads: PerSampleGrads, param: Tensor, kept: bool) -> Tensor | None:
    """``[B, *shape]`` per-sample gradients of a parameter small enough to pool, else ``None``.

    Statistics are computed in at least float32 (half precision is raised to it).
    ``kept``: ``grads`` stays alive after ``backward`` (a deferred projection), so it must
    not cache the tensor formed here.
    """
    if grads.batch_size * param.numel() * max(4, param.element_size()) > MEMBER_BYTES:
        return None
    if not kept:
        dense = grads.materialize()
    else:
        blocks = list(grads.blocks())
        dense = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    # under backward(create_graph=True) the output gradients carry a graph: not held
    return dense.detach() if dense.requires_grad else dense


def reduce_pool(pool: Pool) -> tuple[dict[Identity, list[Any]], dict[Identity, str]]:
    """Every statistic of the pool's parameters, in one batched computation per statistic.

    Returns:
        ``(values, failures)``: per statistic identity, one value per parameter of the pool
        (in its order); and the error message of each statistic that raised (plugin code
        runs here during ``backward``: nothing propagates).

    """
    # in the order of the parameters (backward delivers them in reverse): consumers that keep
    # same-shaped parameters stacked in that order read the pool's rows as one slice
    order = sorted(range(len(pool.indices)), key=pool.indices.__getitem__)
    pool.indices[:] = [pool.indices[k] for k in order]
    pool.grads[:] = [pool.grads[k] for k in order]
    pool.params[:] = [pool.params[k] for k in order]
    if len(pool.finals) == len(order):  # only where projections need them
        pool.finals[:] = [pool.finals[k] for k in order]
    grads = torch.stack(pool.grads)
    pool.grads.clear()  # the stack holds them now
    shape = (grads.shape[1], *pool.params[0].shape)  # one parameter's [B, *shape]
    stacked = PooledGrads(grads.view(grads.shape[0], grads.shape[1], -1), pool.params)
    failures: dict[Identity, str] = {}
    # plugin code runs here during backward(): attempt() guards it
    projected = _projections(pool.stats, stacked, pool.finals, failures)
    values = {identity: list(value.unbind(0)) for identity, value in projected.items()}
    for stat in pool.stats:
        if stat.combine == "project":  # done above
            continue
        value = attempt(stat, failures, stat.kind.from_pooled, stacked, stat)
        if value is NotImplemented:  # no pooled form for these: each parameter on its own
            rows = [
                attempt(
                    stat, failures, stat.kind.from_per_sample, DenseGrads(g.view(shape)), stat, p
                )
                for g, p in zip(stacked.grads, stacked.params)
            ]
            if stat.identity not in failures:
                values[stat.identity] = rows
        elif value is not FAILED:
            values[stat.identity] = list(value.unbind(0))
    return values, failures


def _projections(
    stats: Sequence[Any],
    pool: PooledGrads,
    finals: Sequence[Callable[[], Tensor]],
    failures: dict[Identity, str],
) -> dict[Identity, Tensor]:
    """``g_n . V_k`` of every projection statistic and parameter, in one batched product.

    The directions of all projections (the gradient for ``BATCH_PROJECTION``, ``[P, B]``;
    a ``per_sample_projection``'s ``K``, ``[P, B, K]``) are stacked, so the per-sample
    gradients are read once: ``V G^T``, not ``G V^T``, as a few directions times many rows
    is the product BLAS does fastest on the CPU (a matrix-vector product ``G g`` was ~3x
    slower). A statistic whose directions raise is in ``failures``.
    """
    wanted = [s for s in stats if s.combine == "project"]
    if not wanted:
        return {}
    gradient: list[Tensor] = []  # formed once for all of them

    def final_grads() -> Tensor:
        if not gradient:
            with torch.no_grad():
                gradient.append(torch.stack([final() for final in finals]))
        return gradient[0]

    parts = [(s, attempt(s, failures, _directions, s, pool, final_grads)) for s in wanted]
    parts = [(s, v) for s, v in parts if v is not FAILED]
    if not parts:
        return {}
    vectors = torch.cat([v for _, v in parts], dim=1) if len(parts) > 1 else parts[0][1]
    products = torch.bmm(vectors, pool.grads.mT)  # [P, sum K, B]
    out, start = {}, 0
    for stat, v in parts:
        k = v.shape[1]
        block = products[:, start : start + k]
        out[stat.identity] = block[:, 0] if stat.fn is None else block.mT.contiguous()
        start += k
    return out


def _directions(stat: Any, pool: PooledGrads, final_grads: Callable[[], Tensor]) -> Tensor:
    """``[P, K, D]``: a projection's directions for the pool's parameters (``K = 1``: ``g``)."""
    grads = final_grads()  # [P, *shape]
    if stat.fn is None:  # on the gradient itself
        return grads.reshape(pool.count, 1, -1).to(pool.grads.dtype)
    vectors = _pooled_directions(stat, grads, pool)
    if vectors is NotImplemented:
        return pool.stack([directions(stat, g, p) for g, p in zip(grads, pool.params)])
    return vectors  # type: ignore[no-any-return]  # a Tensor when not NotImplemented


def _pooled_directions(stat: Any, grads: Tensor, pool: PooledGrads) -> Any:
    """``[P, K, D]``: the directions of all the pool's parameters from one call, or ``NotImplemented``."""
    if stat.pooled_directions is None:
        return NotImplemented
    with torch.no_grad():
        vectors = stat.pooled_directions(grads, pool.params)
    if vectors is NotImplemented:
        return vectors
    return vectors.reshape(pool.count, -1, pool.grads.shape[-1]).to(pool.grads.dtype)
