"""Quantities of the global batch under ``torch.distributed`` (DDP), from local statistics.

Each process (rank ``r``, local batch ``B_r``, global batch ``N = sum_r B_r``) computes its
statistics during its own ``backward()``. When the ``with cp(step, ...)`` block ends, after
``backward()`` returned (so DDP's gradient all-reduce has finished), the core combines them
so that every quantity sees the global batch, exactly as one process holding all ``N``
samples would (Li et al., 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", for DDP's averaging). With ``g_n`` the gradient of sample ``n``'s own
loss:

============================  =====================================================
statistic                     combination across ranks
============================  =====================================================
``SUM_GRAD_SQUARED``          ``sum_r`` (a sum over samples)
``BATCH_L2``, ``GRAD_BATCH``  concatenated in rank order (one row per sample)
``BATCH_PROJECTION``          ``g_n . g`` with the *global* ``g``, then concatenated
``per_sample_projection``     ``g_n . V_k(g)``, likewise (directions from the global ``g``)
curvature diagonals           ``sum_r (B_r / N) diag_r`` (each is of a local mean loss)
transforms                    as declared by ``per_sample_transform(reduce=...)``
other kinds                   by the kind's ``combine`` rule
``BATCH_DOT``                 not combinable (needs other ranks' per-sample gradients)
``info["loss"]``              ``sum_r (B_r / N) loss_r``
``info["individual_losses"]`` concatenated;  ``info["batch_size"]``: ``N``
gradient                      DDP's average if all ``B_r`` are equal and the gradients
                              were synchronised; else ``sum_r (B_r / N) grad_r``
Hessian-vector products       ``sum_r (B_r / N) H_r v``: one all-reduce per product
============================  =====================================================

Collectives per tracked step: one all-gather of the batch sizes when the block starts,
one all-gather of a small integer layout vector and one float64 all-reduce (statistics,
loss and, where needed, the gradient; variable-length rows are placed at each rank's
offset in a zero buffer, so concatenation is a sum) when it ends, plus one all-reduce for
the projections (and a tiny all-gather for ``per_sample_projection``) and one per
Hessian-vector product. Every rank must track the same
steps; an exception inside the block on one rank only leaves the others waiting until the
process group's timeout.

This module combines the statistics; :mod:`cockpit_core.distributed_gradient` obtains
the global gradient and what is computed from it (projections, Hessian-vector products).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from cockpit_core.distributed_gradient import (
    DistributedHVP,
    GlobalGradient,
    ReduceBuffer,
    Shares,
)
from cockpit_core.errors import CockpitWarning
from cockpit_core.requirements import MergedRequirements, Statistic

Stats = dict[tuple[str, str], list[Any]]


def active_group(mode: str) -> Any:
    """The default process group if ``mode`` is ``"auto"`` and more than one process runs."""
    if mode == "off" or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.group.WORLD if dist.get_world_size() > 1 else None


def writes_here(write_on: str) -> bool:
    """Whether this process writes the log and sinks (``write_on``: ``rank0`` or ``all``)."""
    if write_on == "all" or not dist.is_available() or not dist.is_initialized():
        return True
    return dist.get_rank() == 0


class Distributed:
    """The processes a Cockpit combines its statistics over."""

    def __init__(self, group: Any):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.backend = dist.get_backend(group)
        self._warned = False

    def device(self, params: Sequence[Tensor]) -> torch.device:
        """Where collective buffers live (NCCL needs the GPU)."""
        if self.backend == "nccl":
            return params[0].device if params else torch.device("cuda")
        return torch.device("cpu")

    def begin(self, info: dict[str, Any], params: Sequence[Tensor]) -> StepSync:
        """Start a tracked step: learn every rank's batch size (one tiny all-gather)."""
        return StepSync(self, info, params)

    def warn_once(self, message: str) -> None:
        """Warn once per Cockpit."""
        if not self._warned:
            self._warned = True
            warnings.warn(f"cockpit: {message}", CockpitWarning, stacklevel=4)


def _local_batch(info: dict[str, Any]) -> int:
    if info.get("batch_size"):
        return int(info["batch_size"])
    if "individual_losses" in info:
        return len(info["individual_losses"])
    return 0


class StepSync:
    """One tracked step's cross-process combination (see the module docstring)."""

    def __init__(self, dist_: Distributed, info: dict[str, Any], params: Sequence[Tensor]):
        self.d = dist_
        self.params = list(params)
        self.dev = dist_.device(self.params)
        local = torch.tensor([_local_batch(info)], dtype=torch.int64, device=self.dev)
        sizes = [torch.zeros_like(local) for _ in range(dist_.world)]
        dist.all_gather(sizes, local, group=dist_.group)
        self.sizes = [int(s) for s in sizes]
        self.known = min(self.sizes) > 0
        if not self.known:  # no batch size known: weight every process equally
            self.sizes = [1] * dist_.world
        self.total = sum(self.sizes)
        self.shares = Shares(
            dist_.group, dist_.rank, dist_.world, tuple(self.sizes), self.dev, dist_.warn_once
        )
        self.weight = self.shares.weight
        self.gradient = GlobalGradient(self.params, self.shares)

    def close(self) -> None:
        """Remove the gradient hooks."""
        self.gradient.close()

    # -- the end of the block ----------------------------------------------------------

    def finish(
        self,
        info: dict[str, Any],
        stats: Stats,
        missing: dict[tuple[str, str], str],
        merged: MergedRequirements,
        hvp: Any,
    ) -> tuple[dict[str, Any], Stats, dict[tuple[str, str], str], list[Tensor], Any]:
        """Combine everything; returns ``(info, stats, missing, grads, hvp)`` of the global batch."""
        self.close()
        d, rank, R = self.d, self.d.rank, self.d.world
        stats = {k: list(v) for k, v in stats.items()}
        missing = dict(missing)
        idents = [s.identity for s in merged.statistics]
        rules = {s.identity: s.combine for s in merged.statistics}
        by_ident = {s.identity: s for s in merged.statistics}
        for ident in idents:
            if rules[ident] is None and ident not in missing:
                missing[ident] = _not_combinable(by_ident[ident])
        nparams = len(self.params)

        # 1. layout: per (statistic, parameter) the local length, -1 if None; missing flags
        meta = [len(info["individual_losses"]) if "individual_losses" in info else -1]
        for ident in idents:
            meta.append(1 if ident in missing else 0)
            for v in stats.get(ident, [None] * nparams):
                if rules[ident] == "project":
                    meta.append(-1 if v is None else 1)
                else:
                    meta.append(-1 if v is None else int(v.numel()))
        mine = torch.tensor(meta, dtype=torch.int64, device=self.dev)
        metas = [torch.zeros_like(mine) for _ in range(R)]
        dist.all_gather(metas, mine, group=d.group)
        table = torch.stack(metas).cpu()  # [R, len(meta)]

        # 2. one float64 all-reduce: sums, weighted means, gathered rows, maxima, gradient
        buf = ReduceBuffer(self.dev)
        pos = 1
        plans: dict[tuple[str, str], list[Any]] = {}
        for ident in idents:
            flags = table[:, pos]
            pos += 1
            lengths = table[:, pos : pos + nparams]
            pos += nparams
            if bool(flags.any()):
                if ident not in missing:
                    who = [r for r in range(R) if flags[r]]
                    missing[ident] = (
                        f"{by_ident[ident].describe()} could not be computed on process(es) "
                        f"{who}; see the errors recorded there."
                    )
                continue
            if rules[ident] == "project":
                continue  # needs the global gradient: step 3
            plans[ident] = [
                self._plan(buf, by_ident[ident], rules[ident], stats[ident][i], lengths[:, i], i)
                for i in range(nparams)
            ]
        loss_slot = None
        if "loss" in info:
            loss_slot = buf.add(
                torch.tensor(_scalar(info["loss"]) * self.weight, dtype=torch.float64)
            )
        losses_slot = None
        if int(table[:, 0].min()) >= 0:
            losses_slot = buf.add_rows(
                info["individual_losses"].detach().reshape(-1), table[:, 0].tolist(), rank
            )
        self.gradient.plan(buf)
        reduced = buf.all_reduce(d.group)

        # 3. unpack
        out: Stats = {}
        for ident, per_param in plans.items():
            out[ident] = [None if p is None else p(reduced) for p in per_param]
        grads = self.gradient.read(reduced)
        projections = [by_ident[i] for i in idents if rules[i] == "project" and i not in missing]
        if projections:
            out.update(self.gradient.project(projections, stats, grads, missing))
        new_info = dict(info)
        if loss_slot is not None:
            loss = info["loss"]
            value = reduced[loss_slot].reshape(())
            new_info["loss"] = (
                value.to(loss.dtype) if isinstance(loss, Tensor) else float(value.item())
            )
        if losses_slot is not None:
            new_info["individual_losses"] = reduced[losses_slot].to(info["individual_losses"].dtype)
        if self.known:
            new_info["batch_size"] = self.total
        if hvp is not None:
            hvp = DistributedHVP(hvp, self.shares)
        return new_info, out, missing, grads, hvp

    def _plan(
        self, buf: ReduceBuffer, stat: Statistic, how: str, value: Any, lengths: Tensor, i: int
    ) -> Any:
        """Put one parameter's statistic into ``buf``; return how to read the result."""
        present = [int(n) for n in lengths.tolist()]
        if all(n < 0 for n in present):
            return None
        p = self.params[i]
        dtype = value.dtype if value is not None else p.dtype
        if how == "gather":
            per_row = _row_shape(stat, p)
            if per_row is None and any(n < 0 for n in present):
                raise RuntimeError(
                    f"{stat.describe()} is missing on some processes for parameter {i}."
                )
            if per_row is not None:  # no gradient on a process: its g_n are zero
                numel = math.prod(per_row)
                present = [n if n >= 0 else self.sizes[r] * numel for r, n in enumerate(present)]
                if value is None:
                    value = torch.zeros(self.sizes[self.d.rank], *per_row, device=self.dev)
            tail = tuple(value.shape[1:])
            sl = buf.add_rows(value.reshape(-1), present, self.d.rank)
            return lambda red: red[sl].to(dtype).reshape(-1, *tail)
        sizes = {n for n in present if n >= 0}
        if len(sizes) != 1:
            raise RuntimeError(f"{stat.describe()} has different sizes on different processes.")
        numel = sizes.pop()
        shape = tuple(value.shape) if value is not None else tuple(p.shape)
        local = value.reshape(-1) if value is not None else torch.zeros(numel, device=self.dev)
        scale = self.weight if how == "mean" else 1.0
        k = stat.max_last
        if k:
            head = buf.add(local[:-k] * scale)
            tail_sl = buf.add_rows(local[-k:], [k] * self.d.world, self.d.rank)

            def read(red: Tensor) -> Tensor:
                maxima = red[tail_sl].reshape(self.d.world, k).max(0).values
                return torch.cat([red[head], maxima]).to(dtype).reshape(shape)

            return read
        sl = buf.add(local * scale)
        return lambda red: red[sl].to(dtype).reshape(shape)


def _row_shape(stat: Statistic, p: Tensor) -> tuple[int, ...] | None:
    """One sample's value shape of a gathered kind that is zero for a zero gradient."""
    sample_shape = getattr(stat.kind, "sample_shape", None)
    return None if sample_shape is None else tuple(sample_shape(p))


def _scalar(loss: Any) -> float:
    if isinstance(loss, Tensor):
        return float(loss.detach().reshape(-1)[0]) if loss.numel() == 1 else float("nan")
    return float(loss)


def _not_combinable(stat: Statistic) -> str:
    why = getattr(stat.kind, "not_combinable", "")
    if why:
        return f"{stat.describe()}: {why}."
    return (
        f"{stat.describe()} declares no cross-process reduction, so it is not available "
        "under torch.distributed. Its author can pass reduce='sum', 'mean' or 'gather' to "
        "per_sample_transform()."
    )


__all__ = ["Distributed", "StepSync", "active_group", "writes_here"]
