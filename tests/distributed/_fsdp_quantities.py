"""Quantities written against the shard protocol, as a third party would (FSDP2 tests).

Each declares ``shards = True``: under FSDP2 ``ctx.params``/``ctx.grads`` (and statistics
with a parameter's shape) hold this process's rows, and :func:`~cockpit_core.shard_sum`
adds per-shard partial sums over the processes. Unsharded, ``shard_sum`` returns its
argument, so the same code gives the first-party quantity's value on one process: the tests compare them with ``grad_norm``,
``distance``, ``mean_gsnr`` and ``norm_test`` of one process on the global batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from cockpit_core import (
    BATCH_L2,
    SUM_GRAD_SQUARED,
    Quantity,
    Requirements,
    StepContext,
    layered,
    shard_sum,
)


def _squared_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.double().pow(2).sum() for t in tensors])


class ShardGradNorm(Quantity):
    """``||g||`` per parameter and in total, from the gradient's rows on each process."""

    name = "shard_grad_norm"
    shards = True

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """``{"total", "per_param"}`` as ``grad_norm``."""
        squares = shard_sum(_squared_norms(ctx.grads))
        return layered(squares.sum().sqrt(), squares.sqrt())


class ShardDistance(Quantity):
    """``||theta_t - theta_0||``, each process keeping only its rows of ``theta_0``."""

    name = "shard_distance"
    shards = True

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """``{"total", "per_param"}`` as ``distance``."""
        params = [p.detach() for p in ctx.params]
        start = ctx.cache.get("initial_params")
        if start is None:
            start = [p.clone() for p in params]
            ctx.cache.put("initial_params", start)
        squares = shard_sum(_squared_norms([p - s for p, s in zip(params, start)]))
        return layered(squares.sum().sqrt(), squares.sqrt())


class ShardMeanGSNR(Quantity):
    """Mean GSNR (Liu et al., 2020) from ``SUM_GRAD_SQUARED`` and ``g``, row by row.

    ``gsnr_d = g_d^2 / ((1/B) sum_n g_{n,d}^2 - g_d^2 + epsilon)``, averaged over all
    entries: per parameter the sum over its rows and its number of entries are partial
    sums over the processes.
    """

    name = "shard_mean_gsnr"
    shards = True
    REQUIREMENTS = Requirements(statistics=(SUM_GRAD_SQUARED,))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """``{"total", "per_param"}`` as ``mean_gsnr`` (epsilon 1e-5)."""
        batch = ctx.batch_size
        sums, sizes = [], []
        for g, s in zip(ctx.grads, ctx.stat(SUM_GRAD_SQUARED)):
            g = g.double()
            var = (s.double() - batch * g.pow(2)).clamp(min=0) / batch
            sums.append((g.pow(2) / (var + 1e-5)).sum())
            sizes.append(torch.tensor(float(g.numel()), dtype=torch.float64))
        both = shard_sum(torch.stack([torch.stack(sums), torch.stack(sizes)]))
        return layered(both[0].sum() / both[1].sum(), both[0] / both[1])


class ShardNormTest(Quantity):
    """Norm test (Byrd et al., 2012) from ``BATCH_L2`` rows and ``||g||^2`` of the shards.

    ``theta_max = sqrt(max(0, sum_n ||g_n||^2 - B ||g||^2) / ((B - 1) B ||g||^2))``. The
    per-sample rows ``[B]`` are whole (never cut to rows, also where ``B`` equals a
    parameter's length, as for the 8-entry biases at a global batch of 8).
    """

    name = "shard_norm_test"
    shards = True
    REQUIREMENTS = Requirements(statistics=(BATCH_L2,))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """``{"total", "per_param"}`` as ``norm_test``."""
        rows = torch.stack([r.double() for r in ctx.stat(BATCH_L2)])  # [P, B]
        batch = rows.shape[1]
        sum_sq, grad_sq = rows.sum(1), shard_sum(_squared_norms(ctx.grads))

        def theta(s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            return ((s - batch * g).clamp(min=0) / (batch - 1) / (batch * g)).sqrt()

        return layered(theta(sum_sq.sum(), grad_sq.sum()), theta(sum_sq, grad_sq))


class ShardFlaky(Quantity):
    """Fails on process 1 before its ``shard_sum``, which process 0 enters (an injected error).

    Process 0 must not wait for process 1 there: the lockstep makes it abandon the quantity.
    """

    name = "shard_flaky"
    shards = True

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Raise on process 1; elsewhere a sum of the gradient's squares."""
        if dist.is_initialized() and dist.get_rank() == 1:
            raise RuntimeError("injected failure")
        return {"total": float(shard_sum(_squared_norms(ctx.grads)).sum())}


SHARD_AWARE = {
    ShardGradNorm.name: "grad_norm",
    ShardDistance.name: "distance",
    ShardMeanGSNR.name: "mean_gsnr",
    ShardNormTest.name: "norm_test",
}
"""Each test quantity and the first-party quantity whose value it must equal."""
