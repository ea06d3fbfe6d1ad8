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
  (``DTensor.to_local()``), never gathered. A quantity sees them only if it declares that
  it works on shards (:func:`declares_shards`): ``ctx.params`` and ``ctx.grads`` are then
  this process's rows, a statistic with the parameter's shape (``SUM_GRAD_SQUARED``) is cut
  to the same rows, and :func:`shard_sum` adds per-shard partial sums over the processes
  (one all-reduce, in the quantities' lockstep). Any other quantity that reads
  ``ctx.params`` or ``ctx.grads`` fails with :data:`PARAMS_REASON` at that access (recorded,
  training goes on); one that needs neither (``loss``, ``grad_hist_1d``) runs as usual.
- **Projections on the gradient** (``BATCH_PROJECTION``, ``per_sample_projection``) are
  missing with :data:`PROJECTION_REASON`: sample ``n``'s gradient is known only on the
  process that holds sample ``n``, the gradient's rows on every process.
- **Hessian-vector products** (double backward through ``fully_shard``) and micro-batch
  gradient norms are refused before the quantity runs, with :data:`HVP_REASON` and
  :data:`MICRO_BATCH_REASON` (:func:`task_refusal`).

Whole steps are refused (every quantity, no collective) when cockpit cannot read the
layout: other ``DTensor`` placements (tensor parallelism, 2-D meshes), a mesh that is not
the Cockpit's process group, parameters of which only some are sharded, or a Cockpit built
before ``fully_shard`` (:func:`refusal`). The decision depends only on the parameters'
types and layouts, the same on every process, so no process issues a collective that
another skips.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

import torch
from torch import Tensor

from cockpit_core.distributed.gradient import GradientUnavailableError, ReduceBuffer, Shares
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
    "{stat} projects each sample's gradient on directions formed from the global gradient; "
    "under FSDP2 (fully_shard) a sample's gradient is known only on the process that holds "
    "the sample, the gradient's rows on every process, so the projection would need the "
    "whole gradient of a layer gathered on one process; cockpit does not gather it "
    f"({DOCS})"
)
"""Why projections on the gradient are missing under FSDP2."""

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
    if model is not None and any(isinstance(p, _SHARDED) for p in model.parameters()):
        return (
            f"{REASON} (the model's parameters were sharded after the Cockpit was built, so "
            "it tracks parameters the model no longer holds: build it after fully_shard)."
        )
    return None


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


def cuts_to_rows(stat: Statistic) -> bool:
    """Whether ``stat``'s values, where they have their parameter's shape, are cut to the rows.

    Those of kinds summed or averaged over samples (``SUM_GRAD_SQUARED``, curvature
    diagonals), not transforms (``per_sample_transform``: their values' shape is the
    author's, whatever it equals) nor per-sample rows.
    """
    return stat.combine in ("sum", "mean") and stat.fn is None


class _Guarded(list):  # type: ignore[type-arg]
    """The local shards of the parameters: readable only by shard-aware quantities."""

    def __init__(self, items: Iterable[Tensor], data: ShardedStepData):
        super().__init__(items)
        self._owner = data

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
        self.params = _Guarded((local(p) for p in self._sharded), self)
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
    "ShardedGradient",
    "ShardedStepData",
    "cuts_to_rows",
    "declares_shards",
    "is_sharded",
    "refusal",
    "shard_reducer",
    "shard_sum",
    "sharded_names",
    "task_refusal",
]
