"""Statistic kinds: what a per-parameter statistic is, and how partial results combine.

A *kind* names a family of statistics (``batch_l2``, ``sum_grad_squared``, a curvature
diagonal, ...). It declares, next to its name, the two things the core needs without
knowing its math:

* ``per_sample``: whether it is derived from per-sample gradients ``g_n``. Then every
  provider that delivers per-sample gradients (:mod:`cockpit_core.statistics.per_sample`)
  can compute it, through ``from_per_sample``;
* ``combine``: how the values of disjoint sets of samples (micro-batches of gradient
  accumulation, ``torch.distributed`` processes, blocks of samples) combine into the value
  of their union, as torchmetrics declares ``dist_reduce_fx`` with a state:

  ==========  ===============================================================
  ``sum``     values add up (sums over samples)
  ``mean``    weighted by each part's share of the samples (the value is of a
              part's *mean* loss, e.g. a curvature diagonal)
  ``gather``  concatenated along the first axis, which is the sample axis
  ``project`` per-sample projections on directions from the *final* gradient:
              formed once the whole batch's gradient is known, then gathered
  ``declared`` the statistic declares its own rule (``per_sample_transform``)
  ``None``    not combinable (e.g. the ``B x B`` Gram matrix across processes)
  ==========  ===============================================================

A kind is a ``str`` subclass, so ``statistic.kind == "batch_l2"`` and dictionaries keyed
by kind name keep working; its attributes carry the declarations. Plugins add kinds with
the ``register_statistic_kinds`` hook (``docs/providers.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from cockpit_core.statistics.per_sample import PerSampleGrads
    from cockpit_core.statistics.pooled import PooledGrads

COMBINE_RULES = frozenset({"sum", "mean", "gather", "project", "declared", None})
"""Valid values of :attr:`StatisticKind.combine`."""


class RequestedStatistic(Protocol):
    """The statistic a kind's ``from_per_sample`` computes, as the kind reads it.

    :class:`~cockpit_core.statistics.statistic.Statistic` satisfies it; a statistic is built
    on its kind (:mod:`cockpit_core.statistics.statistic` imports this module), so kinds
    name only what they read of one.
    """

    @property
    def kind(self) -> str:
        """The statistic's kind."""
        ...

    @property
    def key(self) -> str:
        """Distinguishes statistics of the same kind."""
        ...

    @property
    def options(self) -> tuple[tuple[str, Any], ...]:
        """Hyperparameters as sorted ``(name, value)`` pairs."""
        ...

    @property
    def fn(self) -> Callable[[Tensor, Tensor], Any] | None:
        """The function of a ``transform`` statistic."""
        ...

    @property
    def factored_fn(self) -> Callable[[PerSampleGrads, Tensor], Any] | None:
        """The fast path of a ``transform`` for factored per-sample gradients."""
        ...

    @property
    def pooled_fn(self) -> Callable[[PooledGrads], Any] | None:
        """The form of a ``transform`` for several parameters at once."""
        ...


FromPerSample = Callable[["PerSampleGrads", RequestedStatistic, "Tensor"], Any]
"""``fn(per_sample_grads, statistic, param) -> value`` of a per-sample kind."""

FromPooled = Callable[["PooledGrads", RequestedStatistic], Any]
"""``fn(pool, statistic) -> Tensor`` of a per-sample kind for several parameters at once: the
first axis runs over the pool's parameters (:class:`~cockpit_core.statistics.pooled.PooledGrads`),
or ``NotImplemented``."""

SampleShape = Callable[["Tensor"], tuple[int, ...]]
"""``fn(param) -> shape`` of one sample's value of a gathered kind."""


class StatisticKind(str):
    """A kind of per-parameter statistic: its name and how it combines.

    Args:
        name: snake_case name, unique among installed kinds.
        per_sample: Whether it is a function of the per-sample gradients ``g_n``.
        combine: How values of disjoint sample sets combine (see the module docstring).
        description: One line for ``cockpit plugins`` and ``cp.check``.
        from_per_sample: For per-sample kinds: ``fn(grads, statistic, param)`` computing
            the value from a :class:`~cockpit_core.statistics.per_sample.PerSampleGrads`.
        from_pooled: Optional, for per-sample kinds: ``fn(pool, statistic)`` computing the
            values of several parameters with the same number of elements at once from a
            :class:`~cockpit_core.statistics.pooled.PooledGrads` (``[P, B, D]``); entry ``p``
            of the result must equal ``from_per_sample`` of parameter ``p`` (same shape) up
            to rounding. Small parameters are then reduced together
            (:mod:`cockpit_core.statistics.pool`).
        install_hint: What to install when no installed provider delivers the kind
            (e.g. ``"pip install cockpit-backpack"``); shown in errors.
        sample_shape: For ``gather`` and ``project`` kinds whose value is zero for a zero
            gradient: ``fn(param) -> shape`` of one sample's value. A process on which the
            parameter received no gradient then contributes zeros under
            ``torch.distributed`` instead of failing the statistic.
        not_combinable: For ``combine=None``: why the kind cannot be combined across
            processes, and what to use instead; shown in the error.
        alternative: What to track instead when installed providers cannot serve some
            parameters; shown by ``cp.check``.

    """

    per_sample: bool
    combine: str | None
    description: str
    from_per_sample: FromPerSample | None
    from_pooled: FromPooled | None
    install_hint: str
    sample_shape: SampleShape | None
    not_combinable: str
    alternative: str

    def __new__(
        cls,
        name: str,
        *,
        per_sample: bool,
        combine: str | None,
        description: str = "",
        from_per_sample: FromPerSample | None = None,
        from_pooled: FromPooled | None = None,
        install_hint: str = "",
        sample_shape: SampleShape | None = None,
        not_combinable: str = "",
        alternative: str = "",
    ) -> StatisticKind:
        """Create the kind (see the class docstring for the arguments)."""
        if combine not in COMBINE_RULES:
            raise ValueError(
                f"combine must be one of {sorted(map(str, COMBINE_RULES))}, got {combine!r}."
            )
        if per_sample and from_per_sample is None:
            raise ValueError(
                f"per-sample kind {name!r} needs from_per_sample(grads, statistic, param)."
            )
        kind = super().__new__(cls, name)
        kind.per_sample = per_sample
        kind.combine = combine
        kind.description = description
        kind.from_per_sample = from_per_sample
        kind.from_pooled = from_pooled
        kind.install_hint = install_hint
        kind.sample_shape = sample_shape
        kind.not_combinable = not_combinable
        kind.alternative = alternative
        return kind

    @property
    def name(self) -> str:
        """The kind's name (the string itself)."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return (
            f"StatisticKind({self.name!r}, per_sample={self.per_sample}, combine={self.combine!r})"
        )

    def __reduce__(self) -> Any:  # pickling (torch.distributed spawn) keeps the attributes
        return (_rebuild, (self.name, dict(self.__dict__)))


def _rebuild(name: str, declarations: dict[str, Any]) -> StatisticKind:
    return StatisticKind(name, **declarations)


# -- the built-in kinds ---------------------------------------------------------------------


def _transform(grads: PerSampleGrads, stat: RequestedStatistic, param: Tensor) -> Any:
    if stat.factored_fn is not None and grads.factored:
        value = stat.factored_fn(grads, param)
        if value is not NotImplemented:
            return value
    return stat.fn(grads.materialize(), param)  # type: ignore[misc]


def _pooled_transform(pool: PooledGrads, stat: RequestedStatistic) -> Any:
    return NotImplemented if stat.pooled_fn is None else stat.pooled_fn(pool)


def _scalar_per_sample(param: Tensor) -> tuple[int, ...]:
    return ()


_HVP_ALTERNATIVE = (
    "Quantities based on Hessian-vector products (hess_max_ev, hess_trace with "
    "method='hutchinson') work on any model."
)
_CURVATURE_HINT = (
    "curvature diagonals come from BackPACK's second-order extensions: pip install "
    "cockpit-backpack (MLPs, CNNs), or from cockpit-autodiff for any model: pip install "
    "cockpit-autodiff (or track quantities based on Hessian-vector products, e.g. "
    "hess_trace with method='hutchinson')"
)

BATCH_L2_KIND = StatisticKind(
    "batch_l2",
    per_sample=True,
    combine="gather",
    description="per-sample squared norms ||g_n||^2, [B]",
    from_per_sample=lambda g, s, p: g.batch_l2(),
    from_pooled=lambda pool, s: pool.batch_l2(),
    sample_shape=_scalar_per_sample,
)
SUM_GRAD_SQUARED_KIND = StatisticKind(
    "sum_grad_squared",
    per_sample=True,
    combine="sum",
    description="sum_n g_n * g_n, parameter shape",
    from_per_sample=lambda g, s, p: g.sum_grad_squared(),
    from_pooled=lambda pool, s: pool.sum_grad_squared(),
)
BATCH_DOT_KIND = StatisticKind(
    "batch_dot",
    per_sample=True,
    combine=None,
    description="Gram matrix g_n . g_m, [B, B]",
    from_per_sample=lambda g, s, p: g.batch_dot(),
    not_combinable=(
        "the B x B Gram matrix of per-sample gradients cannot be combined across processes "
        "without sending per-sample gradients between them. Use BATCH_PROJECTION "
        "(g_n . g) and BATCH_L2 instead, or run in one process"
    ),
)
GRAD_BATCH_KIND = StatisticKind(
    "grad_batch",
    per_sample=True,
    combine="gather",
    description="the per-sample gradients, [B, *shape]",
    from_per_sample=lambda g, s, p: g.materialize(),
    sample_shape=lambda p: tuple(p.shape),
)
BATCH_PROJECTION_KIND = StatisticKind(
    "batch_projection",
    per_sample=True,
    combine="project",
    description="projections g_n . V_k on directions from the final gradient, [B] or [B, K]",
    from_per_sample=lambda g, s, p: g,  # projected once the final gradient is known
    sample_shape=_scalar_per_sample,
)
TRANSFORM_KIND = StatisticKind(
    "transform",
    per_sample=True,
    combine="declared",
    description="any function of the per-sample gradients (per_sample_transform)",
    from_per_sample=_transform,
    from_pooled=_pooled_transform,
)
DIAG_HESSIAN_KIND = StatisticKind(
    "diag_hessian",
    per_sample=False,
    combine="mean",
    description="diagonal of the Hessian of the mini-batch loss",
    install_hint=_CURVATURE_HINT,
    alternative=_HVP_ALTERNATIVE,
)
DIAG_GGN_EXACT_KIND = StatisticKind(
    "diag_ggn_exact",
    per_sample=False,
    combine="mean",
    description="diagonal of the generalized Gauss-Newton matrix",
    install_hint=_CURVATURE_HINT,
    alternative=_HVP_ALTERNATIVE,
)
DIAG_GGN_MC_KIND = StatisticKind(
    "diag_ggn_mc",
    per_sample=False,
    combine="mean",
    description="Monte-Carlo estimate of the GGN diagonal",
    install_hint=_CURVATURE_HINT,
    alternative=_HVP_ALTERNATIVE,
)

BUILTIN_KINDS: dict[str, StatisticKind] = {
    k.name: k
    for k in (
        BATCH_L2_KIND,
        SUM_GRAD_SQUARED_KIND,
        BATCH_DOT_KIND,
        GRAD_BATCH_KIND,
        BATCH_PROJECTION_KIND,
        TRANSFORM_KIND,
        DIAG_HESSIAN_KIND,
        DIAG_GGN_EXACT_KIND,
        DIAG_GGN_MC_KIND,
    )
}
"""The kinds every cockpit-core knows, by name."""


def resolve_kind(kind: str) -> StatisticKind | None:
    """``kind`` itself if it is a :class:`StatisticKind`, else the built-in kind of that name."""
    if isinstance(kind, StatisticKind):
        return kind
    return BUILTIN_KINDS.get(kind)
