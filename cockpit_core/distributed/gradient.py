"""The global batch's gradient under ``torch.distributed``, and what is computed from it.

Quantities describe the global batch (``N = sum_r B_r`` samples over the processes), so
they need the gradient of the global mean loss ``g = sum_r (B_r / N) g_r``, with ``g_r``
the gradient of process ``r``'s local mean loss:

- **equal local batches**: DDP's all-reduce already left ``g`` (the plain average) in
  ``p.grad``; a two-number checksum per process confirms that the gradients were in fact
  synchronised (not under ``no_sync()``, model wrapped in DDP), else they are averaged here;
- **unequal local batches**: DDP's average is not ``g``, so gradient hooks capture each
  process's local gradient during ``backward()`` and the weighted sum is all-reduced.

Once ``g`` is known, per-sample projections ``g_n . g`` (``BATCH_PROJECTION``, for the
inner-product and orthogonality tests of Bollapragada, Byrd & Nocedal, 2018) are formed
locally and concatenated across processes, and Hessian-vector products of the global
loss are ``H v = sum_r (B_r / N) H_r v``. Everything travels in a float64
:class:`ReduceBuffer` whose pieces are summed in one all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from cockpit_core.statistics.per_sample import PerSampleGrads
from cockpit_core.statistics.projection import (
    Deferred,
    DeferredConcat,
    failed_directions,
    project,
)

if TYPE_CHECKING:
    from cockpit_core.engine.hvp import HessianVectorProducts


@dataclass(frozen=True)
class Shares:
    """Who takes part in a tracked step and with what weight.

    Attributes:
        group: The process group.
        rank: This process's rank in ``group``.
        world: Number of processes.
        sizes: Every process's local batch size ``B_r`` (all 1 if unknown).
        device: Where collective buffers live.
        warn: Warns once per Cockpit.

    """

    group: Any
    rank: int
    world: int
    sizes: tuple[int, ...]
    device: torch.device
    warn: Callable[[str], None]

    @property
    def weight(self) -> float:
        """The share ``B_r / N`` of the global batch that this process holds."""
        return self.sizes[self.rank] / sum(self.sizes)

    @property
    def equal(self) -> bool:
        """Whether every local batch has the same size (DDP's average is then ``g``)."""
        return len(set(self.sizes)) == 1


class ReduceBuffer:
    """Pieces of a float64 vector that is all-reduced (summed) at once."""

    def __init__(self, device: torch.device):
        self.device = device
        self.parts: list[Tensor] = []
        self.size = 0

    def add(self, value: Tensor) -> slice:
        """Append ``value`` (summed over ranks)."""
        flat = value.detach().reshape(-1).to(self.device, torch.float64)
        self.parts.append(flat)
        start, self.size = self.size, self.size + flat.numel()
        return slice(start, self.size)

    def add_rows(self, value: Tensor, lengths: Sequence[int], rank: int) -> slice:
        """Concatenate every rank's ``value`` (``lengths[r]`` entries each) in rank order."""
        total = int(sum(lengths))
        offset = int(sum(lengths[:rank]))
        region = torch.zeros(total, dtype=torch.float64, device=self.device)
        region[offset : offset + value.numel()] = value.detach().reshape(-1).to(region)
        return self.add(region)

    def all_reduce(self, group: Any) -> Tensor:
        """Sum the buffer over all ranks."""
        if not self.parts:
            return torch.zeros(0, dtype=torch.float64)
        flat = torch.cat(self.parts)
        self.parts = []
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        return flat


class GlobalGradient:
    """Obtains ``g`` of the global batch at the end of a tracked step.

    Args:
        params: The tracked parameters.
        shares: The processes and their batch sizes.

    With unequal local batches it registers gradient hooks at construction (before
    ``backward()``); :meth:`close` removes them.

    """

    def __init__(self, params: Sequence[Tensor], shares: Shares):
        self.params = list(params)
        self.shares = shares
        self._local: list[Tensor | None] = [None] * len(self.params)
        self._handles = []
        self._slots: list[slice] | None = None
        self._check: slice | None = None
        self._flag: slice | None = None
        self._error: str | None = None  # why this process could not plan its part, if so
        self._grads: list[Tensor] = []
        if not shares.equal:  # DDP's average is not the global mean: keep the local gradient
            for i, p in enumerate(self.params):
                if p.requires_grad:
                    self._handles.append(p.register_hook(self._capture(i)))

    def _capture(self, i: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            g = grad.detach()
            prev = self._local[i]
            self._local[i] = g.clone() if prev is None else prev + g

        return hook

    @property
    def local(self) -> list[Tensor]:
        """The local gradients as :meth:`plan` read them (zeros where it failed)."""
        return list(self._grads)

    def close(self) -> None:
        """Remove the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def plan(self, buf: ReduceBuffer) -> None:
        """Put the weighted local gradient (unequal batches) or a checksum into ``buf``.

        Its layout depends only on the parameters' sizes and the number of processes, the
        same everywhere: if this process cannot form its part, it contributes zeros and a
        flag instead, and :meth:`read` raises :class:`GradientUnavailableError` on every
        process.
        """
        params, s = self.params, self.shares
        try:
            pieces = self._pieces()
            failed = 0.0
        except Exception as err:
            self._error = f"{type(err).__name__}: {err}"
            self._grads = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
            sizes = [int(p.numel()) for p in params] if not s.equal else [2]
            pieces = [torch.zeros(n, dtype=torch.float64) for n in sizes]
            failed = 1.0
        if not s.equal:
            self._slots = [buf.add(piece) for piece in pieces]
        else:
            self._check = buf.add_rows(pieces[0], [2] * s.world, s.rank)
        flag = torch.tensor([failed], dtype=torch.float64)
        self._flag = buf.add_rows(flag, [1] * s.world, s.rank)

    def _pieces(self) -> list[Tensor]:
        """The local part: the weighted gradient, or a two-number checksum of ``p.grad``."""
        params, s = self.params, self.shares
        if not s.equal:
            local, self._local = self._local, [None] * len(params)
            self._grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, local)]
            return [g.reshape(-1) * s.weight for g in self._grads]
        self._grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in params]
        checksum = torch.zeros(2, dtype=torch.float64)
        for g in self._grads:
            checksum += torch.stack([g.double().sum(), g.double().abs().sum()]).cpu()
        return [checksum]

    def read(self, reduced: Tensor) -> list[Tensor]:
        """``g`` per parameter from the all-reduced buffer (averaging it here if needed).

        Raises:
            GradientUnavailableError: On every process, if any could not plan its part.

        """
        grads, s = self._grads, self.shares
        if self._flag is not None:
            flags = reduced[self._flag].cpu()
            if bool((flags > 0).any()):
                who = [r for r in range(s.world) if flags[r] > 0]
                here = f" (here: {self._error})" if self._error is not None else ""
                raise GradientUnavailableError(
                    f"the global batch's gradient could not be formed: it failed on "
                    f"process(es) {who}{here}; no quantity is computed at this step"
                )
        if self._slots is not None:
            return [reduced[sl].to(g.dtype).reshape(g.shape) for g, sl in zip(grads, self._slots)]
        sums = reduced[self._check].reshape(s.world, 2)
        spread = (sums - sums[0]).abs().max()
        if float(spread) <= 1e-9 * float(sums[0].abs().max()) + 1e-300:
            return grads  # DDP averaged them: the global mean gradient
        s.warn(
            "the gradients differ between processes when the `with cp(step, ...)` block "
            "ends, so they were not averaged (model not wrapped in DistributedDataParallel, "
            "or backward() ran inside no_sync()). Cockpit averages them for its quantities; "
            "the optimizer still sees the local gradients."
        )
        buf = ReduceBuffer(s.device)
        slots = [buf.add(g.reshape(-1) * s.weight) for g in grads]
        red = buf.all_reduce(s.group)
        return [red[sl].to(g.dtype).reshape(g.shape) for g, sl in zip(grads, slots)]

    def project(
        self,
        declared: list[Any],
        values: dict[tuple[str, str], list[Any]],
        grads: list[Tensor],
        missing: dict[tuple[str, str], str],
    ) -> dict[tuple[str, str], list[Tensor]]:
        """Per-sample projections on directions from ``g``, for the global batch.

        Each process projects its own samples (``[B_r]`` or ``[B_r, K]`` per parameter)
        and the rows are concatenated in rank order (:func:`project_rows`).
        """
        return project_rows(declared, values, self.params, self.shares, grads.__getitem__, missing)


def project_rows(
    declared: Sequence[Any],
    values: dict[tuple[str, str], list[Any]],
    params: Sequence[Tensor],
    shares: Shares,
    gradient: Callable[[int], Tensor],
    missing: dict[tuple[str, str], str],
) -> dict[tuple[str, str], list[Tensor]]:
    """Per-sample projections on directions from ``g``, for the global batch.

    ``gradient(i)``: parameter ``i``'s whole gradient ``g``, asked for once per parameter,
    in order, on every process alike (under FSDP2 it is gathered then: it may issue a
    collective, and is dropped before the next parameter's). Each process projects its
    own samples (``[B_r]`` or ``[B_r, K]`` per parameter) and the rows are concatenated in
    rank order, all statistics in one all-reduce. Directions that fail on any process
    make the statistic missing everywhere (one tiny all-gather of the direction counts,
    only for ``per_sample_projection``).
    """
    s = shares
    local: dict[tuple[str, str], list[Tensor]] = {stat.identity: [] for stat in declared}
    errors: dict[tuple[str, str], str] = {}
    for i, param in enumerate(params):
        try:
            g: Tensor | None = gradient(i)
        except Exception as err:  # the gradient is not known here: every statistic fails
            g = None
            for stat in declared:
                errors.setdefault(stat.identity, failed_directions(stat, err))
        for stat in declared:
            ident = stat.identity
            if ident in errors or g is None:
                continue
            try:
                local[ident].append(_project_one(stat, values[ident][i], g, param, s))
            except Exception as err:
                errors[ident] = failed_directions(stat, err)
        del g  # one parameter's gradient at a time (gathered under FSDP2)
    for ident in errors:
        local.pop(ident, None)
    counts = [
        (int(local[stat.identity][0].shape[1]) if local[stat.identity] else 0)
        if stat.identity in local
        else -1
        for stat in declared
        if stat.fn is not None
    ]
    return _combine_rows(declared, local, errors, counts, params, s, missing)


def _combine_rows(
    declared: Sequence[Any],
    local: dict[tuple[str, str], list[Tensor]],
    errors: dict[tuple[str, str], str],
    counts: list[int],
    params: Sequence[Tensor],
    s: Shares,
    missing: dict[tuple[str, str], str],
) -> dict[tuple[str, str], list[Tensor]]:
    """Concatenate every process's projection rows (see :func:`project_rows`)."""
    custom = [stat for stat in declared if stat.fn is not None]
    width = {stat.identity: 1 for stat in declared if stat.fn is None}
    if custom:  # agree on which statistics every process could project
        mine = torch.tensor(counts, dtype=torch.int64, device=s.device)
        everyone = [torch.zeros_like(mine) for _ in range(s.world)]
        dist.all_gather(everyone, mine, group=s.group)
        table = torch.stack(everyone).cpu()
        for j, stat in enumerate(custom):
            column = table[:, j]
            if int(column.min()) < 0 or int(column.max()) != int(column.min()):
                who = [r for r in range(s.world) if int(column[r]) < 0]
                missing.setdefault(
                    stat.identity,
                    errors.get(stat.identity)
                    or f"{stat.describe()}: its projection directions failed on "
                    f"process(es) {who or list(range(s.world))}; see the errors there.",
                )
                local.pop(stat.identity, None)
            else:
                width[stat.identity] = int(column[0])
    # the layout depends only on what every process knows (the table, the batch sizes):
    # a projection that failed here contributes zeros and a flag in the same all-reduce
    kept = [stat for stat in declared if stat.identity in width]
    buf = ReduceBuffer(s.device)
    slots: dict[tuple[str, str], list[tuple[slice, torch.dtype, tuple[int, ...]]]] = {}
    flags = torch.zeros(len(kept), dtype=torch.float64)
    for j, stat in enumerate(kept):
        ident, k = stat.identity, width[stat.identity]
        lengths = [n * k for n in s.sizes]
        pieces = []
        try:
            if ident not in local:
                raise RuntimeError(errors.get(ident, "no projections"))
            for row in local[ident]:
                if int(row.numel()) != lengths[s.rank]:
                    raise RuntimeError(
                        f"{stat.describe()}: {int(row.numel())} values here, expected "
                        f"{lengths[s.rank]}"
                    )
                pieces.append((row.reshape(-1), row.dtype, tuple(row.shape[1:])))
        except Exception as err:
            errors.setdefault(ident, f"{stat.describe()}: {type(err).__name__}: {err}")
            flags[j] = 1.0
            zero = torch.zeros(lengths[s.rank], device=s.device)
            tail = (k,) if stat.fn is not None else ()
            pieces = [(zero, torch.float64, tail) for _ in params]
        slots[ident] = [
            (buf.add_rows(flat, lengths, s.rank), dt, tail) for flat, dt, tail in pieces
        ]
    flag_slot = buf.add_rows(flags, [len(kept)] * s.world, s.rank) if kept else None
    red = buf.all_reduce(s.group)
    out: dict[tuple[str, str], list[Tensor]] = {}
    failed = red[flag_slot].reshape(s.world, len(kept)).cpu() if flag_slot is not None else None
    for j, stat in enumerate(kept):
        ident = stat.identity
        if failed is not None and bool(failed[:, j].any()):
            who = [r for r in range(s.world) if failed[r, j] > 0]
            here = f" (here: {errors[ident]})" if ident in errors else ""
            missing[ident] = f"{stat.describe()} could not be projected on process(es) {who}{here}."
            continue
        out[ident] = [red[sl].to(dt).reshape(-1, *tail) for sl, dt, tail in slots[ident]]
    return out


def _project_one(
    stat: Any,
    value: PerSampleGrads | DeferredConcat | Tensor | None,
    grad: Tensor,
    param: Tensor,
    shares: Shares,
) -> Tensor:
    """The local projections of one parameter (zeros if it had no gradient here)."""
    if isinstance(value, Deferred):
        return project(stat, value, grad, param)
    if value is not None:
        return value
    rows = shares.sizes[shares.rank]
    if stat.fn is None:
        return torch.zeros(rows, device=shares.device)
    k = int(stat.fn(grad, param.detach()).shape[0])
    return torch.zeros(rows, k, device=shares.device)


class GradientUnavailableError(RuntimeError):
    """The global gradient of a step could not be formed (the same on every process)."""


class OtherProcessError(RuntimeError):
    """What failed on another process (so it fails here too: collectives stay matched)."""


class Lockstep:
    """Keeps the collectives of the quantity phase matched across processes.

    The quantities of a tracked step run in the same order on every process (task ``i``
    has slot ``i + 1``; ``tasks + 1`` means done). Every collective of that phase is an
    all-reduce of the same size: ``size`` payload entries (a Hessian-vector product, zero
    otherwise), then each process's slot, then each process's failure flag per task. A
    process whose quantity raised, locally, goes on to the next one; the others notice it
    in the slots of the next all-reduce: a process behind the furthest one abandons its
    task (:class:`OtherProcessError`), the others repeat their message until everyone is
    at the same slot. :meth:`finish` returns every process's flags once all are done.
    """

    def __init__(self, shares: Shares, size: int, tasks: int):
        self.shares, self.size, self.tasks = shares, size, tasks
        self.slot = 0
        self.lost: set[int] = set()  # tasks abandoned here because another process left them

    def _round(self, payload: Tensor | None, flags: Tensor | None) -> Tensor:
        s = self.shares
        buf = torch.zeros(self.size + s.world * (1 + self.tasks), dtype=torch.float64)
        buf = buf.to(s.device)
        if payload is not None:
            buf[: self.size] = payload
        buf[self.size + s.rank] = float(self.slot)
        if flags is not None and self.tasks:
            start = self.size + s.world + s.rank * self.tasks
            buf[start : start + self.tasks] = flags.to(buf)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=s.group)
        return buf

    def enter(self, task: int) -> None:
        """Task ``task`` (its index) begins here (``Tracker.compute`` calls it)."""
        self.slot = task + 1

    def exchange(self, payload: Tensor) -> Tensor:
        """Sum ``payload`` (``size`` float64 entries) over the processes at this task."""
        s = self.shares
        if int(payload.numel()) != self.size:
            raise RuntimeError(f"{payload.numel()} values to reduce, expected {self.size}")
        while True:
            red = self._round(payload, None)
            slots = red[self.size : self.size + s.world].round().long().cpu()
            if int(slots.min()) == int(slots.max()):
                return red[: self.size]
            if self.slot < int(slots.max()):  # another process left this task: it failed
                self.lost.add(self.slot - 1)
                gone = [r for r in range(s.world) if int(slots[r]) != self.slot]
                raise OtherProcessError(
                    f"process(es) {gone} left this quantity while it exchanged values here "
                    "(Hessian-vector products or shard_sum; it failed there)"
                )
            # ahead of some process: repeat until it catches up

    def finish(self, flags: Tensor) -> Tensor:
        """Every process's flags (``[world, tasks]``) once every process is done."""
        s = self.shares
        self.slot = self.tasks + 1
        while True:
            red = self._round(None, flags)
            slots = red[self.size : self.size + s.world].round().long().cpu()
            if bool((slots == self.slot).all()):
                start = self.size + s.world
                return red[start:].reshape(s.world, self.tasks).cpu()


class DistributedHVP:
    """Hessian-vector products of the global mean loss: ``sum_r (B_r / N) H_r v``."""

    def __init__(self, local: HessianVectorProducts, shares: Shares):
        self._local, self._shares = local, shares
        self.lockstep: Lockstep | None = None

    @property
    def count(self) -> int:
        """Products computed at this step."""
        return self._local.count

    def __call__(self, vectors: Sequence[Tensor]) -> list[Tensor]:
        """``H v`` of the global batch, one tensor per parameter (one all-reduce)."""
        hv = self._local(vectors)
        s = self._shares
        buf = ReduceBuffer(s.device)
        slots = [buf.add(h.reshape(-1) * s.weight) for h in hv]
        if self.lockstep is not None:
            flat = torch.cat(buf.parts) if buf.parts else torch.zeros(0, dtype=torch.float64)
            buf.parts = []
            red = self.lockstep.exchange(flat.to(s.device))
        else:
            red = buf.all_reduce(s.group)
        return [red[sl].to(h.dtype).reshape(h.shape).to(h.device) for h, sl in zip(hv, slots)]

    def release(self) -> None:
        """Free the local gradient graph."""
        self._local.release()
