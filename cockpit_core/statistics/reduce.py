"""From one parameter's per-sample gradients to every statistic requested of it.

Providers that hold per-sample gradients (:mod:`cockpit_core.statistics.per_sample`) call
:func:`reduce_per_sample` as soon as a parameter's gradients are complete (in a backward
hook), so that they can be freed at once. Each statistic is computed in the cheapest way
the form allows:

1. in closed form from the factors (``closed_forms`` of the form; a transform's
   ``factored_fn``; projections by ``dot``);
2. otherwise, if some statistic needs the whole ``[B, *shape]`` tensor (``grad_batch``,
   a transform without a sample-wise rule), from the tensor formed once;
3. otherwise a block of samples at a time: statistics whose kind combines by ``sum`` or
   ``gather`` are computed on each block and combined
   (:func:`cockpit_core.statistics.combine.combine`), all from one pass over the blocks.

A ``factored_fn`` that returns ``NotImplemented`` (no fast path for this form) falls back
to ``fn`` on the materialized gradients, block-wise where its ``reduce`` rule allows. The
value of a statistic does not depend on which other statistics share the step, up to the
rounding of sums over blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from cockpit_core.statistics.combine import combine
from cockpit_core.statistics.per_sample import DenseGrads, PerSampleGrads
from cockpit_core.statistics.projection import project
from cockpit_core.statistics.statistic import Statistic

Identity = tuple[str, str]


def _closed(stat: Any, grads: PerSampleGrads) -> bool:
    if stat.combine == "project" or not grads.factored:
        return True
    return stat.kind in grads.closed_forms


def _blockable(stat: Any) -> bool:
    return stat.combine in ("sum", "gather")


def reduce_per_sample(
    stats: Sequence[Any],
    grads: PerSampleGrads,
    param: Tensor,
    final_gradient: Callable[[], Tensor] | None = None,
) -> tuple[dict[Identity, Any], dict[Identity, str]]:
    """Compute ``stats`` of one parameter from its per-sample gradients.

    Args:
        stats: The per-sample statistics requested of this parameter.
        grads: Its per-sample gradients.
        param: The parameter (transforms receive it detached).
        final_gradient: When the parameter's final gradient is known now (one process, no
            gradient accumulation), a function returning it: projections are then formed
            at once. Otherwise they stay deferred (the value is ``grads`` itself) and the
            core projects them after ``backward()``.

    Returns:
        ``(values, failures)``: a value (detached tensor, or the deferred ``grads``) per
        statistic identity, and the error message of each statistic that raised. A
        raising statistic never propagates: backward must go on.

    """
    theta = param.detach()
    values: dict[Identity, Any] = {}
    failures: dict[Identity, str] = {}
    factored = [
        s for s in stats if s.kind == "transform" and s.factored_fn is not None and grads.factored
    ]
    projections = [s for s in stats if s.combine == "project"]
    others = [s for s in stats if s not in factored and s not in projections]
    blocked = [s for s in others if not _closed(s, grads)]
    if final_gradient is not None and blocked and all(_blockable(s) for s in blocked):
        grads.hold()  # blocks of samples will be formed: keep them for the other statistics
    later = []
    for stat in others:
        if _closed(stat, grads):
            _direct(stat, grads, theta, final_gradient, values, failures)
        else:
            later.append(stat)
    # elementwise statistics first: blocks are then kept for what projects or transforms
    keep = bool(projections) or bool(factored)
    _elementwise(later, grads, theta, values, failures, keep)
    for stat in projections:
        _direct(stat, grads, theta, final_gradient, values, failures)
    declined = []
    for stat in factored:
        value = attempt(stat, failures, stat.factored_fn, grads, theta)
        if value is FAILED:
            continue
        if value is NotImplemented:  # no fast path for this form: fn on the tensors
            declined.append(stat)
        else:
            values[stat.identity] = value
    _elementwise(declined, grads, theta, values, failures, keep=False, use_fn=True)
    return values, failures


def _elementwise(
    stats: list[Any],
    grads: PerSampleGrads,
    theta: Tensor,
    values: dict[Identity, Any],
    failures: dict[Identity, str],
    keep: bool,
    use_fn: bool = False,
) -> None:
    """Statistics that need every element: block-wise if all can be, else on the whole tensor."""
    if not stats:
        return
    compute = _fn if use_fn else lambda stat, g, p: stat.kind.from_per_sample(g, stat, p)
    if all(_blockable(s) for s in stats):
        for block in grads.blocks(keep=keep):
            dense = DenseGrads(block)
            for stat in stats:
                if stat.identity in failures:
                    continue
                part = attempt(stat, failures, compute, stat, dense, theta)
                if part is FAILED:
                    values.pop(stat.identity, None)
                    continue
                values[stat.identity] = combine(stat, values.get(stat.identity), part)
        return
    whole = DenseGrads(grads.materialize())  # some statistic needs it: form it once for all
    for stat in stats:
        value = attempt(stat, failures, compute, stat, whole, theta)
        if value is not FAILED:
            values[stat.identity] = value


def _fn(stat: Statistic, grads: PerSampleGrads, theta: Tensor) -> Tensor:
    """A transform's ``fn`` on materialized per-sample gradients."""
    assert stat.fn is not None  # only transforms come here, and a transform has an fn
    return stat.fn(grads.materialize(), theta)


def _direct(
    stat: Any,
    grads: PerSampleGrads,
    theta: Tensor,
    final_gradient: Callable[[], Tensor] | None,
    values: dict[Identity, Any],
    failures: dict[Identity, str],
) -> None:
    if stat.combine == "project":
        if final_gradient is None:
            values[stat.identity] = grads  # projected after backward
            return
        value = attempt(stat, failures, lambda: project(stat, grads, final_gradient(), theta))
    else:
        value = attempt(stat, failures, stat.kind.from_per_sample, grads, stat, theta)
    if value is not FAILED:
        values[stat.identity] = value


FAILED = object()
"""What :func:`attempt` returns when the computation raised."""


def attempt(
    stat: Any, failures: dict[Identity, str], compute: Callable[..., Any], *args: Any
) -> Any:
    """``compute(*args)`` detached (or ``NotImplemented``); on an exception, record it for ``stat``.

    Plugin code (a transform, a kind's rule, projection directions) runs here during the
    user's ``backward()``: whatever it raises, even ``SystemExit``, is recorded in
    ``failures`` and :data:`FAILED` returned, so that backward goes on. Only
    ``KeyboardInterrupt`` and ``GeneratorExit`` propagate.
    """
    try:
        value = compute(*args)
        return value if value is NotImplemented else value.detach()  # a tensor, or it fails
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as err:  # a failing transform (even SystemExit) must not break backward()
        failures[stat.identity] = f"{type(err).__name__}: {err}"
        return FAILED
