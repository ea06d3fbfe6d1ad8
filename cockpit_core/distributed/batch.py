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
the projections (and a tiny all-gather for ``per_sample_projection``; under FSDP2 one
all-gather of each parameter's gradient rows before it, one parameter at a time) and one
per Hessian-vector product. Every rank must track the same
steps; an exception inside the block on one rank only leaves the others waiting until the
process group's timeout.

This module combines the statistics; :mod:`cockpit_core.distributed.gradient` obtains
the global gradient and what is computed from it (projections, Hessian-vector products).
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from cockpit_core.distributed.gradient import (
    DistributedHVP,
    GlobalGradient,
    GradientUnavailableError,
    Lockstep,
    OtherProcessError,
    ReduceBuffer,
    Shares,
)
from cockpit_core.distributed.sharded import (
    PROJECTION_REASON,
    SHARD_CHUNK,
    ShardedGradient,
    ShardedStepData,
    project_gathered,
    shard_reducer,
)
from cockpit_core.engine.planner import Outcome, Task
from cockpit_core.errors import CockpitWarning
from cockpit_core.requirements import MergedRequirements
from cockpit_core.statistics.statistic import Statistic

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

    def begin(
        self, info: dict[str, Any], params: Sequence[Tensor], sharded: bool = False
    ) -> StepSync:
        """Start a tracked step: learn every rank's batch size (one tiny all-gather).

        ``sharded``: the parameters are FSDP2 shards (:mod:`cockpit_core.distributed.sharded`).
        """
        return StepSync(self, info, params, sharded)

    def warn_once(self, message: str) -> None:
        """Warn once per Cockpit."""
        if not self._warned:
            self._warned = True
            warnings.warn(f"cockpit: {message}", CockpitWarning, stacklevel=4)


def _local_batch(info: dict[str, Any]) -> int:
    """The local batch size, 0 if unknown (never raises: every process all-gathers it)."""
    try:
        if info.get("batch_size"):
            return int(info["batch_size"])
        if "individual_losses" in info:
            return len(info["individual_losses"])
    except Exception:
        return 0
    return 0


class StepSync:
    """One tracked step's cross-process combination (see the module docstring)."""

    def __init__(
        self,
        dist_: Distributed,
        info: dict[str, Any],
        params: Sequence[Tensor],
        sharded: bool = False,
    ):
        self.d = dist_
        self.sharded = sharded
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
        self.gradient: GlobalGradient | ShardedGradient = (
            ShardedGradient(self.params, self.shares)
            if sharded
            else GlobalGradient(self.params, self.shares)
        )
        self.failure: str | None = None  # why no quantity runs (the same on every process)

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

        # 0. do the processes combine the same statistics? (a quantity dropped on one only)
        plan = "|".join(f"{s.identity}:{rules[s.identity]}" for s in merged.statistics)
        header = torch.tensor(
            [len(idents), zlib.crc32(plan.encode())], dtype=torch.int64, device=self.dev
        )
        headers = [torch.zeros_like(header) for _ in range(R)]
        dist.all_gather(headers, header, group=d.group)
        if any(not torch.equal(h.cpu(), headers[0].cpu()) for h in headers):
            for ident in idents:
                missing.setdefault(
                    ident,
                    f"{by_ident[ident].describe()}: the processes did not plan the same "
                    "statistics at this step (a quantity was dropped on some process only; "
                    "see the errors recorded there).",
                )
            idents = []

        # 1. layout: per (statistic, parameter) the local length, -1 if None; missing flags
        has_losses = "individual_losses" in info
        meta = [len(info["individual_losses"]) if has_losses else -1, int("loss" in info)]
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

        # 2. one float64 all-reduce: sums, weighted means, gathered rows, maxima, gradient.
        # Its layout depends only on the table, so it is the same on every process; what
        # fails here contributes zeros and a flag (one per process and statistic) instead.
        buf = ReduceBuffer(self.dev)
        pos = 2
        plans: dict[tuple[str, str], list[Any]] = {}
        errors: dict[tuple[str, str], str] = {}
        packed: list[tuple[str, str]] = []
        local_flags: list[float] = []
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
            stat, how = by_ident[ident], str(rules[ident])
            try:  # from the table alone: the same outcome on every process
                layouts = [self._layout(stat, how, lengths[:, i], i) for i in range(nparams)]
            except RuntimeError as err:
                missing[ident] = str(err)
                continue
            failed = 0.0
            try:
                pieces = [
                    None if lay is None else self._pieces(lay, stats[ident][i], i)
                    for i, lay in enumerate(layouts)
                ]
            except Exception as err:
                errors[ident] = f"{type(err).__name__}: {err}"
                failed = 1.0
                pieces = [
                    None if lay is None else self._pieces(lay, None, i)
                    for i, lay in enumerate(layouts)
                ]
            plans[ident] = [None if pc is None else self._add(buf, pc) for pc in pieces]
            packed.append(ident)
            local_flags.append(failed)
        loss_slot = None
        if int(table[:, 1].min()) > 0:
            try:
                loss_value = _scalar(info["loss"]) * self.weight
            except Exception:
                loss_value = float("nan")
            loss_slot = buf.add(torch.tensor(loss_value, dtype=torch.float64))
        losses_slot = None
        if int(table[:, 0].min()) >= 0:
            lens = table[:, 0].tolist()
            try:
                rows = info["individual_losses"].detach().reshape(-1)
                if int(rows.numel()) != lens[rank]:
                    raise ValueError("individual_losses has not one value per sample")
            except Exception:
                rows = torch.full((lens[rank],), float("nan"), dtype=torch.float64)
            losses_slot = buf.add_rows(rows, lens, rank)
        self.gradient.plan(buf)
        flag_slot = None
        if packed:
            mine_flags = torch.tensor(local_flags, dtype=torch.float64)
            flag_slot = buf.add_rows(mine_flags, [len(packed)] * R, rank)
        reduced = buf.all_reduce(d.group)

        # 3. unpack
        if flag_slot is not None:
            failed_table = reduced[flag_slot].reshape(R, len(packed)).cpu()
            for j, ident in enumerate(packed):
                if bool(failed_table[:, j].any()):
                    who = [r for r in range(R) if failed_table[r, j] > 0]
                    here = f" (here: {errors[ident]})" if ident in errors else ""
                    missing[ident] = (
                        f"{by_ident[ident].describe()} could not be combined: it failed on "
                        f"process(es) {who}{here}."
                    )
                    plans.pop(ident)
        out: Stats = {}
        for ident, per_param in plans.items():
            out[ident] = [None if p is None else p(reduced) for p in per_param]
        try:
            grads = self.gradient.read(reduced)
        except GradientUnavailableError as err:  # on every process: run() records it
            self.failure, grads = str(err), self.gradient.local
            for ident in idents:
                if rules[ident] == "project":
                    missing.setdefault(ident, f"{by_ident[ident].describe()}: {err}.")
        projections = [by_ident[i] for i in idents if rules[i] == "project" and i not in missing]
        if projections and self.sharded:  # sample n's gradient and g's rows live apart
            assert isinstance(self.gradient, ShardedGradient)
            why = self.gradient.reason  # unequal local batches: the rows are not g's
            for stat in projections:
                if stat.fn is not None:  # directions from the sharded parameter and state
                    missing[stat.identity] = PROJECTION_REASON.format(stat=stat.describe())
                elif why is not None:
                    missing[stat.identity] = f"{stat.describe()}: {why}"
            projections = [s for s in projections if s.identity not in missing]
            if projections:
                out.update(
                    project_gathered(projections, stats, grads, self.params, self.shares, missing)
                )
        elif projections:
            assert isinstance(self.gradient, GlobalGradient)  # not sharded
            out.update(self.gradient.project(projections, stats, grads, missing))
        new_info = dict(info)
        if loss_slot is not None:
            loss = info["loss"]
            value = reduced[loss_slot].reshape(())
            new_info["loss"] = (
                value.to(loss.dtype) if isinstance(loss, Tensor) else float(value.item())
            )
        elif int(table[:, 1].max()) > 0:  # only some processes know their loss
            new_info.pop("loss", None)
        if losses_slot is not None:
            new_info["individual_losses"] = reduced[losses_slot].to(info["individual_losses"].dtype)
        else:  # the local per-sample losses are not the global batch's
            new_info.pop("individual_losses", None)
        if self.known:
            new_info["batch_size"] = self.total
        if hvp is not None:
            hvp = DistributedHVP(hvp, self.shares)
        return new_info, out, missing, grads, hvp

    # -- the quantities ------------------------------------------------------------------

    def run(self, tracker: Any, step: int, tasks: list[Task], data: Any, skipped: bool) -> None:
        """Run the step's quantity phases on every process in lockstep; record the outcome.

        Replaces ``tracker.run`` under ``torch.distributed``; every process calls it at every
        tracked step (``skipped``: this process skipped the step, e.g. non-finite values).
        A quantity that fails on any process fails on every process (the error recorded
        by the error policy names the process(es)); no process issues a collective that
        the others do not, so training goes on. See :class:`Lockstep`.
        """
        d, R = self.d, self.d.world
        keys = [_key(t) for t in tasks]
        hvp = data.hvp if isinstance(data.hvp, DistributedHVP) else None
        size = sum(int(p.numel()) for p in self.params) if hvp is not None else 0
        if self.sharded:  # shard_sum's chunks (FSDP2 computes no Hessian-vector product)
            size = SHARD_CHUNK
        crc = zlib.crc32("|".join(keys).encode())
        header = torch.tensor([len(tasks), crc, int(skipped), size], dtype=torch.int64)
        header = header.to(self.dev)
        headers = [torch.zeros_like(header) for _ in range(R)]
        dist.all_gather(headers, header, group=d.group)
        table = torch.stack(headers).cpu()
        common = list(tasks)
        if bool((table[:, :2] != table[0, :2]).any()):  # different quantities scheduled
            lists: list[Any] = [None] * R
            dist.all_gather_object(lists, keys, group=d.group)
            shared = set.intersection(*(set(k) for k in lists))
            order = {k: i for i, k in enumerate(lists[0])}
            common = sorted((t for t in tasks if _key(t) in shared), key=lambda t: order[_key(t)])
            alone = [t for t in tasks if _key(t) not in shared]
            outcomes = []
            for t in alone:
                lacking = [r for r in range(R) if _key(t) not in lists[r]]
                outcomes.append(_elsewhere(t, step, f"it did not run on process(es) {lacking}"))
            tracker.record(step, alone, outcomes)
        if bool(table[:, 2].any()):  # a process skipped the step: every process does
            who = [r for r in range(R) if table[r, 2]]
            if not skipped:
                tracker.policy.skip(
                    step,
                    tasks,
                    f"skipped on process(es) {who}",
                    ("", "skipped elsewhere"),
                    f"step {step} skipped: it was skipped on process(es) {who} (see the "
                    "reason recorded there); training continues.",
                )
            return
        if not common:
            return
        if self.failure is not None:  # known to every process (the all-reduced flags)
            failed = Outcome(False, GradientUnavailableError(self.failure))
            tracker.record(step, common, [failed] * len(common))
            return
        lock = Lockstep(self.shares, int(table[:, 3].max()), len(common))
        if hvp is not None:
            hvp.lockstep = lock
        before: Callable[[int], None] = lock.enter
        if isinstance(data, ShardedStepData):  # what each quantity may read; shard_sum
            before = _entering_sharded(lock, data, common)

        try:
            outcomes = tracker.compute(step, common, data, before=before)
        finally:
            if isinstance(data, ShardedStepData):
                data.leave()
        flags = torch.tensor(
            [0.0 if ok else 2.0 if i in lock.lost else 1.0 for i, (ok, _) in enumerate(outcomes)],
            dtype=torch.float64,
        )
        everyone = lock.finish(flags)
        for i, task in enumerate(common):
            column = everyone[:, i]
            if not bool(column.any()) or (not outcomes[i].ok and i not in lock.lost):
                continue  # fine everywhere, or failed here: recorded as computed
            who = [r for r in range(R) if column[r] == 1.0] or [
                r for r in range(R) if column[r] > 0
            ]
            outcomes[i] = _elsewhere(task, step, f"it failed on process(es) {who}")
        tracker.record(step, common, outcomes)

    # -- packing the statistics ------------------------------------------------------------

    def _layout(self, stat: Statistic, how: str, lengths: Tensor, i: int) -> Any:
        """Where parameter ``i``'s statistic goes in the buffer, from the table alone."""
        present = [int(n) for n in lengths.tolist()]
        if all(n < 0 for n in present):
            return None
        p = self.params[i]
        if how == "gather":
            per_row = _row_shape(stat, p)
            if per_row is None and any(n < 0 for n in present):
                raise RuntimeError(
                    f"{stat.describe()} is missing on some processes for parameter {i}."
                )
            if per_row is not None:  # no gradient on a process: its g_n are zero
                numel = math.prod(per_row)
                present = [n if n >= 0 else self.sizes[r] * numel for r, n in enumerate(present)]
            return ("gather", present, per_row)
        sizes = {n for n in present if n >= 0}
        if len(sizes) != 1:
            raise RuntimeError(f"{stat.describe()} has different sizes on different processes.")
        numel = sizes.pop()
        k = stat.max_last
        if k and numel < k:
            raise RuntimeError(f"{stat.describe()} has fewer than {k} values.")
        return (how, numel, k)

    def _pieces(self, layout: Any, value: Any, i: int) -> Any:
        """The local tensors for ``layout`` (zeros if ``value`` is None) and how to read them."""
        p = self.params[i]
        rank = self.d.rank
        if layout[0] == "gather":
            _, present, per_row = layout
            dtype = value.dtype if value is not None else p.dtype
            if value is None:
                flat = torch.zeros(present[rank], dtype=torch.float64)
                tail = tuple(per_row) if per_row is not None else ()
            else:
                flat, tail = value.reshape(-1), tuple(value.shape[1:])
            if int(flat.numel()) != present[rank]:
                raise RuntimeError(f"{int(flat.numel())} values here, expected {present[rank]}")
            return ("gather", flat, present, dtype, tail)
        how, numel, k = layout
        dtype = value.dtype if value is not None else p.dtype
        shape = tuple(value.shape) if value is not None else tuple(p.shape)
        local = value.reshape(-1) if value is not None else torch.zeros(numel, dtype=torch.float64)
        if int(local.numel()) != numel:
            raise RuntimeError(f"{int(local.numel())} values here, expected {numel}")
        scale = self.weight if how == "mean" else 1.0
        return ("reduce", local, scale, k, dtype, shape)

    def _add(self, buf: ReduceBuffer, pieces: Any) -> Any:
        """Put ``pieces`` into ``buf``; return how to read the combined value."""
        if pieces[0] == "gather":
            _, flat, present, dtype, tail = pieces
            sl = buf.add_rows(flat, present, self.d.rank)
            return lambda red: red[sl].to(dtype).reshape(-1, *tail)
        _, local, scale, k, dtype, shape = pieces
        if k:
            head = buf.add(local[:-k] * scale)
            tail_sl = buf.add_rows(local[-k:], [k] * self.d.world, self.d.rank)

            def read(red: Tensor) -> Tensor:
                maxima = red[tail_sl].reshape(self.d.world, k).max(0).values
                return torch.cat([red[head], maxima]).to(dtype).reshape(shape)

            return read
        sl = buf.add(local * scale)
        return lambda red: red[sl].to(dtype).reshape(shape)


def _entering_sharded(
    lock: Lockstep, data: ShardedStepData, tasks: list[Task]
) -> Callable[[int], None]:
    """Before task ``i``: its lockstep slot, and what its quantity may read of the shards."""
    data.reduce_with(shard_reducer(lock.exchange, lock.shares.world))

    def before(i: int) -> None:
        lock.enter(i)
        data.enter(tasks[i].quantity)

    return before


def _key(task: Task) -> str:
    """A task's name, the same on every process."""
    return f"{task.quantity.key}:{task.phase}"


def _elsewhere(task: Task, step: int, why: str) -> Outcome:
    """``task`` failed because of other processes: the outcome every process records."""
    err = OtherProcessError(
        f"'{task.quantity.key}' ({task.phase}) is not recorded at step {step}: {why} "
        "(see the error recorded there); every process records it as failed."
    )
    return Outcome(False, err)


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
