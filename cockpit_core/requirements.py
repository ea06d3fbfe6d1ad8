"""What a quantity needs at a step, and how the core merges the needs of many quantities.

A quantity never computes per-sample statistics itself and never touches BackPACK save
fields. It *declares* :class:`Statistic` objects in its :class:`Requirements`; the core
merges the declarations of all quantities active at a step, asks a backend to compute each
distinct statistic once, and hands the results to the quantities through
:class:`~cockpit_core.context.StepContext`.

Per-sample conventions: ``g_n`` is the gradient of sample ``n``'s own loss ``l_n`` (not
scaled by ``1/B``), so the mini-batch gradient of a mean-reduced loss is
``g = (1/B) sum_n g_n``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from cockpit_core.errors import RequirementConflictError

TransformFn = Callable[[Tensor, Tensor], Tensor]
"""``fn(per_sample_grads, param) -> Tensor`` with ``per_sample_grads`` of shape ``[B, *param.shape]``."""


@dataclass(frozen=True)
class Statistic:
    """A per-parameter statistic that the core computes once per step for all quantities.

    Two statistics with the same ``kind`` and ``key`` are the same statistic; if their
    ``options`` differ, the requesting quantities conflict.

    Attributes:
        kind: What is computed (see the module-level constants).
        key: Distinguishes statistics of the same kind (used by transforms).
        options: Hyperparameters as sorted ``(name, value)`` pairs.
        fn: The function of a ``transform`` statistic.

    """

    kind: str
    key: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    fn: TransformFn | None = field(default=None, compare=False, hash=False)

    @property
    def identity(self) -> tuple[str, str]:
        """``(kind, key)``: statistics with equal identity are computed once."""
        return (self.kind, self.key)

    @property
    def per_sample(self) -> bool:
        """Whether the statistic is derived from per-sample gradients."""
        return self.kind in PER_SAMPLE_KINDS

    def describe(self) -> str:
        """Readable form, e.g. ``diag_ggn_mc(mc_samples=1)``."""
        name = f"{self.kind}[{self.key}]" if self.key else self.kind
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"{name}({opts})" if opts else name


#: Per-sample squared L2 norms ``||g_n||^2``, shape ``[B]``.
BATCH_L2 = Statistic("batch_l2")
#: Sum of squared per-sample gradients ``sum_n g_n * g_n``, shape of the parameter.
SUM_GRAD_SQUARED = Statistic("sum_grad_squared")
#: Gram matrix of per-sample gradients ``g_n . g_m``, shape ``[B, B]``.
BATCH_DOT = Statistic("batch_dot")
#: The per-sample gradients themselves, shape ``[B, *param.shape]`` (memory-hungry).
GRAD_BATCH = Statistic("grad_batch")
#: Diagonal of the Hessian of the mini-batch loss, shape of the parameter.
DIAG_HESSIAN = Statistic("diag_hessian")
#: Diagonal of the generalized Gauss-Newton matrix of the mini-batch loss.
DIAG_GGN_EXACT = Statistic("diag_ggn_exact")


def diag_ggn_mc(mc_samples: int = 1) -> Statistic:
    """Monte-Carlo estimate of the GGN diagonal from ``mc_samples`` sampled backward passes."""
    return Statistic("diag_ggn_mc", options=(("mc_samples", int(mc_samples)),))


def per_sample_transform(key: str, fn: TransformFn) -> Statistic:
    """Any function of one parameter's per-sample gradients, computed once per step.

    Args:
        key: Unique name of the computation, including every option that changes the result
            (e.g. ``"grad_hist_1d(bins=100,range=(-1,1))"``). Quantities that use the same
            key share one result.
        fn: ``fn(per_sample_grads, param) -> Tensor`` with ``per_sample_grads`` of shape
            ``[B, *param.shape]``.

    """
    return Statistic("transform", key=key, fn=fn)


PER_SAMPLE_KINDS = frozenset(
    {"batch_l2", "sum_grad_squared", "batch_dot", "grad_batch", "transform"}
)
CURVATURE_KINDS = frozenset({"diag_hessian", "diag_ggn_exact", "diag_ggn_mc"})
KNOWN_KINDS = PER_SAMPLE_KINDS | CURVATURE_KINDS


@dataclass(frozen=True)
class Requirements:
    """What a quantity needs to compute its value at one step.

    Attributes:
        statistics: Per-parameter statistics computed by the core during backpropagation.
        info: Keys that must be present in the ``info`` dict of ``cockpit(step, info=...)``.
        loss_graph: Whether Hessian-vector products (``ctx.hvp``) are used; the user's
            ``backward`` must then keep the graph (``retain_graph=cp.retain_graph(step)``).

    """

    statistics: tuple[Statistic, ...] = ()
    info: frozenset[str] = frozenset()
    loss_graph: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "statistics", tuple(self.statistics))
        object.__setattr__(self, "info", frozenset(self.info))
        for stat in self.statistics:
            if stat.kind not in KNOWN_KINDS:
                raise ValueError(
                    f"Unknown statistic kind {stat.kind!r}; known: {sorted(KNOWN_KINDS)}."
                )
            if stat.kind == "transform" and stat.fn is None:
                raise ValueError(
                    "A transform statistic needs a function: use per_sample_transform()."
                )


NO_REQUIREMENTS = Requirements()


@dataclass(frozen=True)
class MergedRequirements:
    """The union of the requirements of all quantities active at one step.

    Attributes:
        statistics: Each distinct statistic once, in first-requested order.
        owners: For each statistic identity, the names of the quantities that requested it.
        loss_graph: Whether any quantity needs Hessian-vector products.

    """

    statistics: tuple[Statistic, ...]
    owners: dict[tuple[str, str], tuple[str, ...]]
    loss_graph: bool

    @property
    def per_sample(self) -> bool:
        """Whether any statistic needs per-sample gradients."""
        return any(s.per_sample for s in self.statistics)

    @property
    def empty(self) -> bool:
        """Whether nothing beyond a plain backward pass is needed."""
        return not self.statistics and not self.loss_graph


def merge_requirements(requests: Iterable[tuple[str, Requirements]]) -> MergedRequirements:
    """Merge ``(quantity_name, requirements)`` pairs; compute each shared statistic once.

    Raises:
        RequirementConflictError: Two quantities request the same statistic with different
            hyperparameters; the message names both quantities.

    """
    chosen: dict[tuple[str, str], Statistic] = {}
    owners: dict[tuple[str, str], list[str]] = {}
    loss_graph = False
    for name, req in requests:
        loss_graph = loss_graph or req.loss_graph
        for stat in req.statistics:
            ident = stat.identity
            if ident not in chosen:
                chosen[ident] = stat
                owners[ident] = [name]
                continue
            if chosen[ident].options != stat.options:
                first = owners[ident][0]
                raise RequirementConflictError(
                    f"Quantities '{first}' and '{name}' request the statistic "
                    f"'{stat.kind}' with different hyperparameters: "
                    f"{chosen[ident].describe()} vs {stat.describe()}. Only one can be "
                    "computed per step: give both quantities the same options, or schedule "
                    "them on different steps."
                )
            owners[ident].append(name)
    return MergedRequirements(
        statistics=tuple(chosen.values()),
        owners={k: tuple(v) for k, v in owners.items()},
        loss_graph=loss_graph,
    )
