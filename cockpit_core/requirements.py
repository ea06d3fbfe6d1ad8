"""What a quantity needs at a step, and how the core merges the needs of many quantities.

A quantity never computes per-sample statistics itself and never touches BackPACK save
fields. It *declares* :class:`~cockpit_core.statistics.statistic.Statistic` objects (the
built-in ones and the factories below) in its :class:`Requirements`; the core merges the
declarations of all quantities active at a step, asks a backend to compute each distinct
statistic once, and hands the results to the quantities through
:class:`~cockpit_core.context.StepContext`.

Per-sample conventions: ``g_n`` is the gradient of sample ``n``'s own loss ``l_n`` (not
scaled by ``1/B``), so the mini-batch gradient of a mean-reduced loss is
``g = (1/B) sum_n g_n``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import Tensor

from cockpit_core.errors import RequirementConflictError
from cockpit_core.observe.probe import Probe
from cockpit_core.statistics.kinds import (
    BATCH_DOT_KIND,
    BATCH_L2_KIND,
    BATCH_PROJECTION_KIND,
    BUILTIN_KINDS,
    DIAG_GGN_EXACT_KIND,
    DIAG_GGN_MC_KIND,
    DIAG_HESSIAN_KIND,
    GRAD_BATCH_KIND,
    SUM_GRAD_SQUARED_KIND,
    TRANSFORM_KIND,
    StatisticKind,
)
from cockpit_core.statistics.statistic import (
    FactoredTransformFn,
    PooledDirectionsFn,
    PooledTransformFn,
    Statistic,
    TransformFn,
)

#: Per-sample squared L2 norms ``||g_n||^2``, shape ``[B]``.
BATCH_L2 = Statistic(BATCH_L2_KIND)
#: Sum of squared per-sample gradients ``sum_n g_n * g_n``, shape of the parameter.
SUM_GRAD_SQUARED = Statistic(SUM_GRAD_SQUARED_KIND)
#: Gram matrix of per-sample gradients ``g_n . g_m``, shape ``[B, B]``.
BATCH_DOT = Statistic(BATCH_DOT_KIND)
#: The per-sample gradients themselves, shape ``[B, *param.shape]`` (memory-hungry).
GRAD_BATCH = Statistic(GRAD_BATCH_KIND)
#: Projections ``g_n . g`` of the per-sample gradients on the mini-batch gradient ``g``,
#: shape ``[B]``. Computed after ``backward()`` returned, so under ``torch.distributed``
#: ``g`` is the gradient of the global batch (unlike ``BATCH_DOT``, it can be aggregated).
BATCH_PROJECTION = Statistic(BATCH_PROJECTION_KIND)
#: Diagonal of the Hessian of the mini-batch loss, shape of the parameter.
DIAG_HESSIAN = Statistic(DIAG_HESSIAN_KIND)
#: Diagonal of the generalized Gauss-Newton matrix of the mini-batch loss.
DIAG_GGN_EXACT = Statistic(DIAG_GGN_EXACT_KIND)


def diag_ggn_mc(mc_samples: int = 1) -> Statistic:
    """Monte-Carlo estimate of the GGN diagonal from ``mc_samples`` sampled backward passes."""
    return Statistic(DIAG_GGN_MC_KIND, options=(("mc_samples", int(mc_samples)),))


def per_sample_transform(
    key: str,
    fn: TransformFn,
    reduce: str | None = None,
    max_last: int = 0,
    *,
    factored_fn: FactoredTransformFn | None = None,
    pooled_fn: PooledTransformFn | None = None,
) -> Statistic:
    """Any function of one parameter's per-sample gradients, computed once per step.

    Args:
        key: Unique name of the computation, including every option that changes the result
            (e.g. ``"grad_hist_1d(bins=100,range=(-1,1))"``). Quantities that use the same
            key share one result.
        fn: ``fn(per_sample_grads, param) -> Tensor`` with ``per_sample_grads`` of shape
            ``[B, *param.shape]``.
        reduce: How results of several processes combine into the global batch's result:
            ``"sum"`` (counts, sums over samples), ``"mean"`` (means over samples, weighted
            by batch size), ``"gather"`` (one row per sample) or ``None`` (not combinable;
            the statistic is then unavailable under ``torch.distributed``).
        max_last: With ``reduce="sum"``, the number of trailing entries that are maxima.
        factored_fn: Optional ``factored_fn(grads, param) -> Tensor``, called instead of
            ``fn`` for a parameter whose per-sample gradients the provider holds in a
            factored form (``grads.factored``): a
            :class:`~cockpit_core.statistics.per_sample.PerSampleGrads` subclass, e.g.
            :class:`~cockpit_core.statistics.per_sample.OuterProductGrads` for linear layers
            (``g_n = sum_t d_nt a_nt^T`` with or without a sequence axis ``t``), ``ConvGrads``
            or ``EmbeddingGrads``. Every form has ``dot(V)`` (``g_n . V_k``, ``[B, K]``),
            ``mean()``, ``blocks()`` and ``materialize()``; test the form with
            ``isinstance`` before using its factors. It must return what ``fn`` returns on
            ``grads.materialize()`` (up to rounding), or ``NotImplemented`` to let the core
            call ``fn`` on materialized blocks (see docs/writing_quantities.md).
        pooled_fn: Optional ``pooled_fn(pool) -> Tensor`` for several small parameters with
            the same number of elements ``D`` at once: ``pool`` is a
            :class:`~cockpit_core.PooledGrads` whose ``grads`` are
            ``[P, B, D]`` (``params``: the ``P`` parameters). Return a tensor whose entry
            ``p`` along the first axis is what ``fn`` returns for parameter ``p`` (up to
            rounding), or ``NotImplemented``. Without it, each parameter is computed on
            its own; with it, small parameters cost a few batched operations in all
            instead of a few each (see docs/performance.md).

    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {sorted(map(str, REDUCTIONS))}, got {reduce!r}.")
    if max_last and reduce != "sum":
        raise ValueError("max_last needs reduce='sum'.")
    return Statistic(
        TRANSFORM_KIND,
        key=key,
        fn=fn,
        reduce=reduce,
        max_last=int(max_last),
        factored_fn=factored_fn,
        pooled_fn=pooled_fn,
    )


def per_sample_projection(
    key: str,
    directions: Callable[[Tensor, Tensor], Tensor],
    *,
    pooled_directions: PooledDirectionsFn | None = None,
) -> Statistic:
    """Projections ``g_n . V_k`` on directions that depend on the final mini-batch gradient.

    Like :data:`BATCH_PROJECTION` (its special case ``V = g``), the projections are formed
    after ``backward()`` returned, from per-sample gradients the backend keeps in compact
    form, so ``g`` is the gradient of the global batch under ``torch.distributed`` and of
    the whole batch under gradient accumulation. Each process projects its own samples on
    the same directions, and the rows are concatenated: the result is exact across
    processes, which a ``per_sample_transform`` projecting on the local gradient is not.

    Args:
        key: Unique name of the computation (see :func:`per_sample_transform`).
        directions: ``directions(grad, param) -> Tensor`` of shape ``[K, *param.shape]``,
            called once per parameter with its final mini-batch gradient. It must depend
            only on values that are equal on every process (gradient, parameters,
            optimizer state).
        pooled_directions: Optional ``pooled_directions(grads, params) -> Tensor``: the
            directions of ``P`` small parameters of one shape at once, which the core
            projects pooled per-sample gradients on (see ``pooled_fn`` of
            :func:`per_sample_transform`). ``grads`` is ``[P, *shape]`` (their final
            gradients stacked), ``params`` the ``P`` parameters; return ``[P, K, *shape]``
            whose entry ``p`` is ``directions(grads[p], params[p])`` (up to rounding), or
            ``NotImplemented`` to have ``directions`` called per parameter.

    Returns:
        A statistic whose value per parameter is ``[B, K]``.

    """
    return Statistic(
        BATCH_PROJECTION_KIND,
        key=key,
        fn=directions,
        reduce="gather",
        pooled_directions=pooled_directions,
    )


REDUCTIONS = frozenset({None, "sum", "mean", "gather"})


@dataclass(frozen=True)
class Requirements:
    """What a quantity needs to compute its value at one step.

    Attributes:
        statistics: Per-parameter statistics computed by the core during backpropagation.
        info: Keys that must be present in the ``info`` dict of ``cockpit(step, info=...)``.
        loss_graph: Whether Hessian-vector products (``ctx.hvp``) are used; the user's
            ``backward`` must then keep the graph (``retain_graph=cp.retain_graph(step)``).
        probes: Reductions of module outputs, or of calls of torch functions, in the
            step's forward pass (:class:`~cockpit_core.observe.probe.Probe`, read with
            ``ctx.probe(key)``);
            they need the model (``Cockpit(model, ...)`` or ``cp.attach(model)``).
        micro_batch_norms: Whether the squared norm of each micro-batch's own gradient is
            recorded during its backward pass (read with ``ctx.micro_batch_norms``;
            :mod:`cockpit_core.engine.micro_batch_norms`).

    """

    statistics: tuple[Statistic, ...] = ()
    info: frozenset[str] = frozenset()
    loss_graph: bool = False
    probes: tuple[Probe, ...] = ()
    micro_batch_norms: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "statistics", tuple(self.statistics))
        object.__setattr__(self, "info", frozenset(self.info))
        object.__setattr__(self, "probes", tuple(self.probes))
        for probe in self.probes:
            if not isinstance(probe, Probe):
                raise ValueError(f"{probe!r} is not a cockpit_core.Probe.")
        for stat in self.statistics:
            if not isinstance(stat.kind, StatisticKind):
                raise ValueError(
                    f"Unknown statistic kind {str(stat.kind)!r}: give a StatisticKind object "
                    f"(cockpit_core.StatisticKind) or a built-in name ({sorted(BUILTIN_KINDS)})."
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
        probes: Each distinct probe once (by key), in first-requested order.
        micro_batch_norms: Whether any quantity reads the micro-batch gradient norms.

    """

    statistics: tuple[Statistic, ...]
    owners: dict[tuple[str, str], tuple[str, ...]]
    loss_graph: bool
    probes: tuple[Probe, ...] = ()
    micro_batch_norms: bool = False

    @property
    def per_sample(self) -> bool:
        """Whether any statistic needs per-sample gradients."""
        return any(s.per_sample for s in self.statistics)

    @property
    def empty(self) -> bool:
        """Whether nothing beyond a plain backward pass is needed."""
        return (
            not self.statistics
            and not self.loss_graph
            and not self.probes
            and not self.micro_batch_norms
        )


def merge_requirements(requests: Iterable[tuple[str, Requirements]]) -> MergedRequirements:
    """Merge ``(quantity_name, requirements)`` pairs; compute each shared statistic once.

    Raises:
        RequirementConflictError: Two quantities request the same statistic with different
            hyperparameters; the message names both quantities.

    """
    chosen: dict[tuple[str, str], Statistic] = {}
    owners: dict[tuple[str, str], list[str]] = {}
    loss_graph = False
    probes: dict[str, Probe] = {}
    micro_batch_norms = False
    for name, req in requests:
        loss_graph = loss_graph or req.loss_graph
        micro_batch_norms = micro_batch_norms or req.micro_batch_norms
        for probe in req.probes:
            probes.setdefault(probe.key, probe)
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
        probes=tuple(probes.values()),
        micro_batch_norms=micro_batch_norms,
    )
