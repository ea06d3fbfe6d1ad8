"""Sharded parameters (FSDP2's ``fully_shard``): what cockpit computes from the shards.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) every tracked parameter is a
``DTensor`` whose dimension 0 is split over the processes (``Shard(0)`` on a 1-D mesh,
chunks as ``torch.chunk``): process ``r`` holds rows ``[start_r, stop_r)``. During a
layer's forward and backward FSDP gathers the whole (unsharded) weight, and
reduce-scatters the layer's gradient into a sharded ``p.grad``: with equal local batches
that is the global batch's mean gradient ``g``, shard by shard.

What cockpit does at a tracked step with such parameters:

- **Per-sample statistics** come from the module hooks on this process's local batch: the
  hooks see the unsharded weight (``cockpit_hooks`` maps it to the tracked ``DTensor``),
  so each process forms whole-layer per-sample statistics of its own samples, and
  :class:`~cockpit_core.distributed.batch.StepSync` combines them by each kind's rule,
  exactly as under DDP (sums, concatenated rows, maxima); ``loss`` likewise.
- **The global gradient and the parameters** are read only as local shards
  (``DTensor.to_local()``), never gathered for a quantity. A quantity sees them only if it declares that
  it works on shards (:func:`declares_shards`): ``ctx.params`` and ``ctx.grads`` are then
  this process's rows, a statistic with the parameter's shape (``SUM_GRAD_SQUARED``) is cut
  to the same rows, and :func:`shard_sum` adds per-shard partial sums over the processes
  (one all-reduce, in the quantities' lockstep). Any other quantity that reads
  ``ctx.params`` or ``ctx.grads`` fails with :data:`PARAMS_REASON` at that access (recorded,
  training goes on); one that needs neither (``loss``, ``grad_hist_1d``) runs as usual.
- **Projections on the gradient** (``BATCH_PROJECTION``, ``g_n . g``): sample ``n``'s
  gradient is formed only on the process that holds sample ``n``, the gradient's rows live
  on every process. Each process gathers the gradient of one parameter at a time (one
  all-gather of every process's rows, :func:`gathered_gradient`), projects its own samples
  on it and drops it before the next parameter; the rows are then combined as under DDP.
  No process holds more than one parameter's whole gradient beyond FSDP's own buffers.
  ``per_sample_projection`` (directions ``fn(g, theta)`` from the parameter and, for
  ``alpha``, the optimizer's sharded state) is missing with :data:`PROJECTION_REASON`.
- **Hessian-vector products** (double backward through ``fully_shard``) and micro-batch
  gradient norms are refused before the quantity runs, with :data:`HVP_REASON` and
  :data:`MICRO_BATCH_REASON` (:func:`task_refusal`).

Whole steps are refused (every quantity, no collective) when cockpit cannot read the
layout: other ``DTensor`` placements (tensor parallelism, 2-D meshes), a mesh that is not
the Cockpit's process group, parameters of which only some are sharded, or a Cockpit built
before ``fully_shard`` (:func:`refusal`; the model's parameters are listed once per
model and again only when one of them is replaced). The decision depends only on the
parameters' types and layouts, the same on every process, so no process issues a
collective that another skips.
"""

from __future__ import annotations

import contextvars
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

import torch
import torch.distributed as dist
from torch import Tensor

from cockpit_core.distributed.gradient import (
    GradientUnavailableError,
    ReduceBuffer,
    Shares,
    project_rows,
)
from cockpit_core.errors import UnsupportedModelError
from cockpit_core.statistics.statistic import Statistic
from cockpit_core.step_data import StepData

_SHARDED: tuple[type, ...]
try:  # torch builds without distributed support have no DTensor: nothing is sharded there
    from torch.distributed.tensor import DTensor, Shard

    _SHARDED = (DTensor,)
except ImportError:  # pragma: no cover - depends on the torch build
    _SHARDED = ()

DOCS = "docs/distributed.md#fsdp-fully_shard"

REASON = (
    "the tracked parameters are DTensors that cockpit cannot read (sharded other than by "
    "FSDP2's fully_shard over the Cockpit's processes: tensor parallelism, a 2-D mesh, "
    "distributed='off', or only some parameters sharded), so it computes no quantity on "
    f"them and issues no collective ({DOCS})"
)
"""Why every quantity of a step is refused when the parameters' layout is not FSDP2's."""

PARAMS_REASON = (
    "the tracked parameters are sharded by FSDP2 (fully_shard): this quantity reads "
    "ctx.params or ctx.grads, which hold only this process's shard, and does not declare "
    "that it combines per-shard values (a class attribute `shards = True` and "
    "cockpit_core.distributed.sharded.shard_sum); cockpit refuses it rather than report "
    f"the value of one shard ({DOCS})"
)
"""Why a quantity that reads the parameters or gradients but does not declare shards fails."""

UNEQUAL_REASON = (
    "the tracked parameters are sharded by FSDP2 (fully_shard) and the local batches differ "
    "in size ({sizes}): FSDP's reduce-scatter averages the processes' local mean gradients, "
    "which is not the global batch's mean gradient, and cockpit does not rebuild it from "
    f"the shards; quantities that read ctx.grads are refused at such steps ({DOCS})"
)
"""Why the gradient is unavailable to shard-aware quantities with unequal local batches."""

PROJECTION_REASON = (
    "{stat} projects each sample's gradient on directions fn(g, theta) that its author "
    "computes from a parameter's whole gradient and the parameter itself (alpha: also the "
    "optimizer's state); under FSDP2 (fully_shard) the parameter and the optimizer's state "
    "are sharded DTensors, and cockpit gathers only the gradient, one parameter at a time, "
    f"for BATCH_PROJECTION ({DOCS})"
)
"""Why ``per_sample_projection`` statistics are missing under FSDP2."""

HVP_REASON = (
    "this quantity needs Hessian-vector products (double backward), and the tracked "
    "parameters are sharded by FSDP2 (fully_shard): the loss's graph holds the gathered, "
    "unsharded weights, not the tracked DTensors, and FSDP reduce-scatters each layer's "
    "gradient outside autograd, so even backward(create_graph=True) leaves a sharded "
    f"p.grad without a graph; cockpit refuses it at every step ({DOCS})"
)
"""Why quantities with Hessian-vector products are refused under FSDP2."""

MICRO_BATCH_REASON = (
    "this quantity needs each micro-batch's gradient norms, which cockpit records with "
    "gradient hooks on the tracked parameters; under FSDP2 (fully_shard) the backward pass "
    "reaches the gathered, unsharded weights instead, so cockpit refuses it at every step "
    f"({DOCS})"
)
"""Why quantities reading micro-batch gradient norms are refused under FSDP2."""

SHARD_CHUNK = 1024
"""Entries per lockstep all-reduce of :func:`shard_sum` (longer vectors take several)."""


def sharded_names(params: Iterable[Tensor], names: Iterable[str]) -> list[str]:
    """The names of those of ``params`` that are ``DTensor`` s (empty if none is)."""
    return [n for p, n in zip(params, names) if isinstance(p, _SHARDED)]


def _fsdp_layout(p: Tensor, world: int) -> bool:
    """Whether ``p`` is a ``DTensor`` split along dimension 0 over ``world`` processes."""
    if not isinstance(p, _SHARDED) or p.dim() == 0:
        return False
    mesh, placements = p.device_mesh, p.placements  # type: ignore[attr-defined]
    return (
        mesh.ndim == 1
        and mesh.size() == world
        and len(placements) == 1
        and isinstance(placements[0], Shard)
        and placements[0].dim == 0
    )


def refusal(
    params: Sequence[Tensor],
    names: Sequence[str],
    model: torch.nn.Module | None = None,
    world: int | None = None,
) -> str | None:
    """Why no quantity runs on ``params`` at all, or ``None`` (not sharded, or FSDP2's layout).

    ``world``: the number of processes the Cockpit combines over (``None``: it does not
    combine, ``distributed="off"`` or one process). ``model`` (the attached model, if
    any) catches a Cockpit built before ``fully_shard``, which replaced the parameters it
    tracks by ``DTensor`` s.
    """
    found = sharded_names(params, names)
    if found:
        if world is not None and len(found) == len(params):
            if all(_fsdp_layout(p, world) for p in params):
                return None
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        return f"{REASON} (sharded: '{found[0]}'{more})."
    if model is not None and holds_sharded(model):
        return (
            f"{REASON} (the model's parameters were sharded after the Cockpit was built, so "
            "it tracks parameters the model no longer holds: build it after fully_shard)."
        )
    return None


class _Layout:
    """Where a model keeps each of its parameters, and whether any of them is a ``DTensor``.

    Modules and parameters are held by weak references: the layout is the value of a
    ``WeakKeyDictionary`` keyed by the model, which a strong reference would keep alive
    (and with it every Cockpit attached to the model).
    """

    def __init__(self, model: torch.nn.Module):
        self.slots = [
            (weakref.ref(module), name, weakref.ref(p))
            for module in model.modules()
            for name, p in module.named_parameters(recurse=False)
        ]
        self.sharded = any(isinstance(p(), _SHARDED) for _, _, p in self.slots)

    def unchanged(self) -> bool:
        """Whether every parameter is still the one registered where it was listed."""
        for module_ref, name, param_ref in self.slots:
            module, param = module_ref(), param_ref()
            if module is None or param is None or getattr(module, name, None) is not param:
                return False
        return True


_LAYOUTS: weakref.WeakKeyDictionary[torch.nn.Module, _Layout] = weakref.WeakKeyDictionary()


def holds_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor``.

    Listing a model's parameters at every tracked step costs (the module tree is walked),
    so the answer is kept per model and recomputed only when one of the parameters it saw
    is no longer registered where it was (``fully_shard`` registers a ``DTensor`` in place
    of every parameter of the modules it shards): a few dictionary look-ups per step.
    """
    layout = _LAYOUTS.get(model)
    if layout is None or not layout.unchanged():
        layout = _LAYOUTS[model] = _Layout(model)
    return layout.sharded


def is_sharded(params: Sequence[Tensor]) -> bool:
    """Whether the tracked parameters are ``DTensor`` s (checked by :func:`refusal` first)."""
    return bool(params) and isinstance(params[0], _SHARDED)


def declares_shards(quantity: Any) -> bool:
    """Whether ``quantity`` declares that it works on local shards (``shards = True``)."""
    return getattr(quantity, "shards", False) is True


def task_refusal(requirements: Any) -> str | None:
    """Why a task with ``requirements`` cannot run on FSDP2 shards at all, or ``None``."""
    if getattr(requirements, "loss_graph", False):
        return HVP_REASON
    if getattr(requirements, "micro_batch_norms", False):
        return MICRO_BATCH_REASON
    for stat in getattr(requirements, "statistics", ()):
        # refused before the step: its compact per-sample forms (every layer's inputs and
        # output gradients) would otherwise be kept through backward for nothing
        if stat.combine == "project" and stat.fn is not None:
            return PROJECTION_REASON.format(stat=stat.describe())
    return None


def rows(p: Tensor, rank: int, world: int) -> slice:
    """The rows of dimension 0 that process ``rank`` holds (``torch.chunk`` of ``world``)."""
    size = int(p.shape[0])
    chunk = math.ceil(size / world)
    start = min(rank * chunk, size)
    return slice(start, min(start + chunk, size))


def local(p: Tensor) -> Tensor:
    """The local shard of ``p`` (a plain tensor, sharing the parameter's storage)."""
    return p.to_local().detach() if isinstance(p, _SHARDED) else p.detach()  # type: ignore[attr-defined]


def local_grads(params: Sequence[Tensor]) -> list[Tensor]:
    """The local shard of each ``p.grad`` (zeros if it has none or is frozen)."""
    out = []
    for p in params:
        g = p.grad
        if g is None or not p.requires_grad:
            out.append(torch.zeros_like(local(p)))
        else:
            out.append(local(g))
    return out


class LocalGrad:
    """A parameter's local shard as the non-finite check reads it (``grad``, ``numel``)."""

    def __init__(self, grad: Tensor | None):
        self.grad = grad

    def numel(self) -> int:
        """Entries of the local gradient."""
        return 0 if self.grad is None else int(self.grad.numel())


def local_params_for_checks(params: Sequence[Tensor]) -> list[LocalGrad]:
    """The local gradient shards, for checks that read ``p.grad`` (e.g. non-finite values)."""
    return [LocalGrad(None if p.grad is None else local(p.grad)) for p in params]


class GatherBuffer:
    """One buffer per dtype that the parameters' gradients are gathered into in turn.

    Sized for the largest parameter (padded to the processes' chunks) when first used, so
    the gradients gathered for projections never take more than that: each parameter's
    overwrites the previous one's, which its user dropped by then.
    """

    def __init__(self, params: Sequence[Tensor], shares: Shares):
        self.shares = shares
        self.numel = max((_padded(p.shape, shares.world) for p in params), default=0)
        self._flat: dict[torch.dtype, Tensor] = {}

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """A ``shape`` view of the buffer of ``dtype`` (its first entries)."""
        n = math.prod(shape)
        flat = self._flat.get(dtype)
        if flat is None or flat.numel() < n:
            size = max(n, self.numel)
            flat = self._flat[dtype] = torch.empty(size, dtype=dtype, device=self.shares.device)
        return flat[:n].view(*shape)


def _padded(shape: Sequence[int], world: int) -> int:
    """Entries of a parameter of ``shape`` padded to ``world`` equal chunks of dimension 0."""
    if not len(shape):
        return 1
    rows = math.ceil(int(shape[0]) / world) * world
    return rows * math.prod(int(n) for n in shape[1:])


def gathered_gradient(rows_here: Tensor, shape: Sequence[int], buffer: GatherBuffer) -> Tensor:
    """One parameter's whole gradient from every process's rows: one all-gather.

    Every process calls it alike, parameter by parameter (for projections on the gradient,
    :func:`project_gathered`). Each process's rows are padded to ``torch.chunk``'s chunk and
    gathered into ``buffer``; the result is a view of it, valid until the next parameter's
    gradient is gathered. If this process cannot send its rows it sends zeros (the
    collective stays matched) and raises afterwards.
    """
    shares = buffer.shares
    chunk = math.ceil(int(shape[0]) / shares.world)
    tail = tuple(int(n) for n in shape[1:])
    send = torch.zeros((chunk, *tail), dtype=rows_here.dtype, device=shares.device)
    error: Exception | None = None
    try:
        send[: rows_here.shape[0]] = rows_here
    except Exception as err:  # e.g. rows of another shape: zeros go out, the error after
        send.zero_()
        error = err
    out = buffer.take((shares.world * chunk, *tail), send.dtype)
    _gather_into(out, send, group=shares.group)
    if error is not None:
        raise RuntimeError(f"this process's gradient rows could not be sent: {error!r}")
    return out[: int(shape[0])].to(rows_here.device)


def _gather_into(out: Tensor, send: Tensor, group: Any) -> None:
    """``all_gather_single`` (torch >= 2.13), else ``all_gather_into_tensor``."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, send, group=group)


def project_gathered(
    declared: Sequence[Statistic],
    values: dict[tuple[str, str], list[Any]],
    grads: Sequence[Tensor],
    params: Sequence[Tensor],
    shares: Shares,
    missing: dict[tuple[str, str], str],
) -> dict[tuple[str, str], list[Tensor]]:
    """``BATCH_PROJECTION`` of the global batch from the gradient's rows (``grads``).

    Parameter by parameter, every process gathers the whole gradient into one buffer of
    the largest parameter's size (:func:`gathered_gradient`, :class:`GatherBuffer`) and
    projects its own samples on it; the rows are then concatenated over the processes as
    under DDP (one all-reduce).
    """
    buffer = GatherBuffer(params, shares)

    def gradient(i: int) -> Tensor:
        return gathered_gradient(grads[i], params[i].shape, buffer)

    return project_rows(declared, values, params, shares, gradient, missing)


# -- what quantities see ------------------------------------------------------------------

_REDUCER: contextvars.ContextVar[Callable[[Tensor], Tensor] | None] = contextvars.ContextVar(
    "cockpit_shard_reducer", default=None
)


def shard_sum(values: Tensor) -> Tensor:
    """Sum ``values`` (per-shard partial sums, e.g. ``[P]`` squared norms) over the processes.

    For a quantity that declares ``shards = True``: under FSDP2 ``ctx.params``/``ctx.grads``
    hold this process's rows, so a sum over a parameter's entries is the sum over every
    process of its rows' partial sums. Every process must call it alike (same order, same
    number of values: it runs in the lockstep of the quantities' collectives). Outside a
    sharded step (one process, DDP, no sharding) ``values`` is already the whole sum and is
    returned as it is, so the same code serves both.

    Returns:
        The sum over the processes, same shape, dtype and device as ``values``.

    """
    reduce = _REDUCER.get()
    return values if reduce is None else reduce(values)


def tracked_params(params: Sequence[Tensor]) -> list[Tensor]:
    """The parameters that ``params`` (a quantity's ``ctx.params``) stand for, as tracked.

    Under FSDP2 ``ctx.params`` holds this process's rows, new tensors; the optimizer holds
    the tracked ``DTensor`` s. A quantity that finds parameters by identity (in
    ``optimizer.param_groups`` or its ``state``) looks up these instead. Elsewhere it
    returns the parameters themselves. Reading it is not reading the values: any quantity
    may call it.
    """
    tracked = getattr(params, "tracked", None)
    return list(params) if tracked is None else list(tracked)


def cuts_to_rows(stat: Statistic) -> bool:
    """Whether ``stat``'s values, where they have their parameter's shape, are cut to the rows.

    Those of kinds summed or averaged over samples (``SUM_GRAD_SQUARED``, curvature
    diagonals), not transforms (``per_sample_transform``: their values' shape is the
    author's, whatever it equals) nor per-sample rows.
    """
    return stat.combine in ("sum", "mean") and stat.fn is None


class _Guarded(list):  # type: ignore[type-arg]
    """The local shards of the parameters: readable only by shard-aware quantities."""

    def __init__(self, items: Iterable[Tensor], data: ShardedStepData, tracked: list[Tensor]):
        super().__init__(items)
        self._owner = data
        self.tracked = tracked

    def __iter__(self) -> Iterator[Tensor]:
        self._owner.check_access()
        return super().__iter__()

    @overload
    def __getitem__(self, i: SupportsIndex) -> Tensor: ...
    @overload
    def __getitem__(self, i: slice) -> list[Tensor]: ...
    def __getitem__(self, i: Any) -> Any:
        self._owner.check_access()
        return super().__getitem__(i)


class _Statistics(dict):  # type: ignore[type-arg]
    """The combined statistics; for a shard-aware quantity cut to this process's rows."""

    def __init__(self, values: dict[Any, Any], data: ShardedStepData):
        super().__init__(values)
        self._owner = data

    def __getitem__(self, ident: Any) -> Any:
        row = super().__getitem__(ident)
        return self._owner.cut(row) if self._owner.aware and ident in self._owner.cuts else row


class ShardedStepData(StepData):
    """:class:`StepData` of a step whose parameters FSDP2 shards (see the module docstring).

    ``enter(quantity)`` (called before each task, in the lockstep) selects what the task's
    quantity may read: a shard-aware one reads local shards and may call
    :func:`shard_sum` (through :meth:`reduce_with`'s function); any other fails at
    ``ctx.params``/``ctx.grads``.
    ``gradient_reason``: why the local gradient shards are not the global batch's, if so;
    ``declared``: the step's statistics (those of :func:`cuts_to_rows` are cut to the rows).
    """

    def __init__(
        self,
        *args: Any,
        sharded: Sequence[Tensor],
        rank: int,
        world: int,
        local_grads: Sequence[Tensor] | None,
        gradient_reason: str | None,
        declared: Sequence[Statistic] = (),
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.cuts = frozenset(s.identity for s in declared if cuts_to_rows(s))
        self._sharded = list(sharded)
        self._rows = [rows(p, rank, world) for p in self._sharded]
        self._local_grads = None if local_grads is None else list(local_grads)
        self._gradient_reason = gradient_reason
        self._reduce: Callable[[Tensor], Tensor] | None = None
        self.aware = False
        self.params = _Guarded((local(p) for p in self._sharded), self, self._sharded)
        self.statistics = _Statistics(self.statistics, self)
        self._token: contextvars.Token[Any] | None = None

    def reduce_with(self, reduce: Callable[[Tensor], Tensor]) -> None:
        """How :func:`shard_sum` sums over the processes at this step (the lockstep's)."""
        self._reduce = reduce

    def enter(self, quantity: Any) -> None:
        """The next task's quantity is ``quantity``: what it may read, and :func:`shard_sum`."""
        self.leave()
        self.aware = declares_shards(quantity)
        self._token = _REDUCER.set((self._reduce or _unreduced) if self.aware else None)

    def leave(self) -> None:
        """No task runs now (restores :func:`shard_sum` outside sharded steps)."""
        if self._token is not None:
            _REDUCER.reset(self._token)
            self._token = None
        self.aware = False

    def check_access(self) -> None:
        """Raise :data:`PARAMS_REASON` unless the running quantity declares shards."""
        if not self.aware:
            raise UnsupportedModelError(PARAMS_REASON)

    def cut(self, row: Any) -> Any:
        """Each parameter's value cut to this process's rows if it has the parameter's shape."""
        if not isinstance(row, list) or len(row) != len(self._sharded):
            return row
        return [
            v[sl] if isinstance(v, Tensor) and tuple(v.shape) == tuple(p.shape) else v
            for v, p, sl in zip(row, self._sharded, self._rows)
        ]

    @property
    def grads(self) -> list[Tensor]:
        """The local rows of the global gradient (shard-aware quantities only)."""
        self.check_access()
        if self._gradient_reason is not None:
            raise UnsupportedModelError(self._gradient_reason)
        if self._local_grads is None:
            self._local_grads = local_grads(self._sharded)
        return self._local_grads

    def release(self) -> None:
        """Free per-step buffers."""
        self.leave()
        self._local_grads = None
        super().release()


def _unreduced(values: Tensor) -> Tensor:
    raise RuntimeError("shard_sum called outside the quantities' lockstep of a sharded step")


def shard_reducer(exchange: Callable[[Tensor], Tensor], world: int) -> Callable[[Tensor], Tensor]:
    """:func:`shard_sum` over ``exchange`` (fixed-size float64 all-reduces of the lockstep).

    The first entry of each call carries its length, so processes that sum vectors of
    different lengths fail alike instead of mixing them.
    """

    def reduce(values: Tensor) -> Tensor:
        flat = values.detach().reshape(-1).to(torch.float64).cpu()
        payload = torch.cat([torch.tensor([float(flat.numel())], dtype=torch.float64), flat])
        pieces = []
        for start in range(0, int(payload.numel()), SHARD_CHUNK):
            chunk = torch.zeros(SHARD_CHUNK, dtype=torch.float64)
            part = payload[start : start + SHARD_CHUNK]
            chunk[: part.numel()] = part
            pieces.append(exchange(chunk).cpu()[: part.numel()])
        summed = torch.cat(pieces)
        if float(summed[0]) != world * float(flat.numel()):
            raise RuntimeError("shard_sum: the processes summed vectors of different lengths")
        return summed[1:].reshape(values.shape).to(values.dtype).to(values.device)

    return reduce


class ShardedGradient:
    """The global gradient under FSDP2: this process's rows of ``p.grad``, never gathered.

    With equal local batches FSDP's reduce-scatter left the global batch's mean gradient
    in the shards; with unequal ones it did not (:data:`UNEQUAL_REASON`). Its part of the
    end-of-step all-reduce is one failure flag per process, so that a process that cannot
    read its shards fails the step on every process alike.
    """

    def __init__(self, params: Sequence[Tensor], shares: Shares):
        self.params = list(params)
        self.shares = shares
        self._grads: list[Tensor] = []
        self._flag: slice | None = None
        self._error: str | None = None

    @property
    def local(self) -> list[Tensor]:
        """The local gradient shards as :meth:`plan` read them."""
        return list(self._grads)

    @property
    def reason(self) -> str | None:
        """Why the shards are not the global batch's gradient, if so."""
        if self.shares.equal:
            return None
        return UNEQUAL_REASON.format(sizes="/".join(str(n) for n in self.shares.sizes))

    def close(self) -> None:
        """Nothing to remove (the shards are read when the block ends)."""

    def plan(self, buf: ReduceBuffer) -> None:
        """Read the local shards; add this process's failure flag to ``buf``."""
        s = self.shares
        failed = 0.0
        try:
            self._grads = local_grads(self.params)
        except Exception as err:
            self._error = f"{type(err).__name__}: {err}"
            self._grads = [torch.zeros(0, dtype=torch.float64) for _ in self.params]
            failed = 1.0
        flag = torch.tensor([failed], dtype=torch.float64)
        self._flag = buf.add_rows(flag, [1] * s.world, s.rank)

    def read(self, reduced: Tensor) -> list[Tensor]:
        """The local shards; raises :class:`GradientUnavailableError` if any process failed."""
        s = self.shares
        assert self._flag is not None  # plan() ran
        flags = reduced[self._flag].cpu()
        if bool((flags > 0).any()):
            who = [r for r in range(s.world) if flags[r] > 0]
            here = f" (here: {self._error})" if self._error is not None else ""
            raise GradientUnavailableError(
                f"the gradient's shards could not be read on process(es) {who}{here}; no "
                "quantity is computed at this step"
            )
        return self.local


__all__ = [
    "HVP_REASON",
    "MICRO_BATCH_REASON",
    "PARAMS_REASON",
    "PROJECTION_REASON",
    "REASON",
    "UNEQUAL_REASON",
    "GatherBuffer",
    "ShardedGradient",
    "ShardedStepData",
    "cuts_to_rows",
    "declares_shards",
    "gathered_gradient",
    "holds_sharded",
    "is_sharded",
    "project_gathered",
    "refusal",
    "shard_reducer",
    "shard_sum",
    "sharded_names",
    "task_refusal",
    "tracked_params",
]
