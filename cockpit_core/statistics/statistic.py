"""A per-parameter statistic: one kind of value, computed once per step for all quantities.

A quantity declares :class:`Statistic` objects in its
:class:`~cockpit_core.requirements.Requirements`; the core merges the declarations of all
quantities active at a step (:mod:`cockpit_core.requirements`) and asks a provider to
compute each distinct statistic once. What a statistic is (per-sample or not, how partial
results combine) is its kind's declaration (:mod:`cockpit_core.statistics.kinds`).

Per-sample conventions: ``g_n`` is the gradient of sample ``n``'s own loss ``l_n`` (not
scaled by ``1/B``), so the mini-batch gradient of a mean-reduced loss is
``g = (1/B) sum_n g_n``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import Tensor

from cockpit_core.statistics.kinds import StatisticKind, resolve_kind

if TYPE_CHECKING:
    from cockpit_core.statistics.per_sample import PerSampleGrads
    from cockpit_core.statistics.pooled import PooledGrads

TransformFn = Callable[[Tensor, Tensor], Tensor]
"""``fn(per_sample_grads, param) -> Tensor`` with ``per_sample_grads`` of shape ``[B, *param.shape]``."""

FactoredTransformFn = Callable[["PerSampleGrads", Tensor], Any]
"""``fn(per_sample_grads, param) -> Tensor`` on a factored
:class:`~cockpit_core.statistics.per_sample.PerSampleGrads` (see ``factored_fn``); may
return ``NotImplemented`` to fall back to ``fn`` on the materialized gradients."""

PooledTransformFn = Callable[["PooledGrads"], Any]
"""``fn(pool) -> Tensor`` of a ``transform`` for several parameters at once (see ``pooled_fn``)."""

PooledDirectionsFn = Callable[[Tensor, tuple[Tensor, ...]], Any]
"""``fn(grads, params) -> Tensor``: a projection's directions for ``P`` same-shaped parameters
at once, ``grads`` ``[P, *shape]`` -> ``[P, K, *shape]`` (see ``pooled_directions``)."""


@dataclass(frozen=True)
class Statistic:
    """A per-parameter statistic that the core computes once per step for all quantities.

    Two statistics with the same ``kind`` and ``key`` are the same statistic; if their
    ``options`` differ, the requesting quantities conflict.

    Attributes:
        kind: What is computed: a :class:`~cockpit_core.statistics.kinds.StatisticKind`
            (a built-in kind may be given by its name).
        key: Distinguishes statistics of the same kind (used by transforms).
        options: Hyperparameters as sorted ``(name, value)`` pairs.
        fn: The function of a ``transform`` statistic.
        reduce: How a ``transform`` combines across processes (``torch.distributed``) and
            micro-batches: ``"sum"``, ``"mean"`` (weighted by batch size), ``"gather"``
            (concatenate along the first axis, which must be the sample axis) or ``None``
            (cannot be combined: the statistic is reported missing under DDP).
        max_last: With ``reduce="sum"``: the last ``max_last`` entries are maxima, combined
            with ``max`` instead of ``+``.
        factored_fn: Optional fast path of a ``transform`` for factored per-sample
            gradients (see :func:`~cockpit_core.requirements.per_sample_transform`); ``fn``
            must give the same value.
        pooled_fn: Optional form of a ``transform`` for several small parameters with the
            same number of elements at once (see
            :func:`~cockpit_core.requirements.per_sample_transform`).
        pooled_directions: Optional form of a projection's ``fn`` (its directions) for
            several same-shaped parameters at once (see
            :func:`~cockpit_core.requirements.per_sample_projection`).

    """

    kind: StatisticKind | str
    key: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    fn: TransformFn | None = field(default=None, compare=False, hash=False)
    reduce: str | None = field(default=None, compare=False, hash=False)
    max_last: int = field(default=0, compare=False, hash=False)
    factored_fn: FactoredTransformFn | None = field(default=None, compare=False, hash=False)
    pooled_fn: PooledTransformFn | None = field(default=None, compare=False, hash=False)
    pooled_directions: PooledDirectionsFn | None = field(default=None, compare=False, hash=False)
    _identity: tuple[str, str] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        resolved = resolve_kind(self.kind)
        if resolved is not None:
            object.__setattr__(self, "kind", resolved)
        # read thousands of times per step: formed once
        object.__setattr__(self, "_identity", (str(self.kind), self.key))

    @property
    def identity(self) -> tuple[str, str]:
        """``(kind, key)``: statistics with equal identity are computed once."""
        return self._identity

    @property
    def per_sample(self) -> bool:
        """Whether the statistic is derived from per-sample gradients."""
        return isinstance(self.kind, StatisticKind) and self.kind.per_sample

    @property
    def combine(self) -> str | None:
        """How values of disjoint sample sets combine: the kind's rule, or ``reduce``."""
        if not isinstance(self.kind, StatisticKind):
            return None
        return self.reduce if self.kind.combine == "declared" else self.kind.combine

    def describe(self) -> str:
        """Readable form, e.g. ``diag_ggn_mc(mc_samples=1)``."""
        name = f"{self.kind}[{self.key}]" if self.key else self.kind
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"{name}({opts})" if opts else name
