"""Per-sample projections on directions that depend on the final mini-batch gradient.

``BATCH_PROJECTION`` (``g_n . g``) and ``per_sample_projection`` (``g_n . V_k(g)``) need the
gradient of the whole batch, which under ``torch.distributed`` or gradient accumulation is
known only after ``backward()`` returned. A provider therefore leaves the per-sample
gradients of such a statistic in their compact form (a
:class:`~cockpit_core.statistics.per_sample.PerSampleGrads`, or a :class:`DeferredConcat`
of several micro-batches), and the core projects them once the final gradient is known
(:func:`resolve_projections`; :mod:`cockpit_core.distributed.gradient` under DDP).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core.statistics.per_sample import PerSampleGrads
from cockpit_core.statistics.statistic import Statistic


class DeferredConcat:
    """Deferred per-sample gradients of several micro-batches, projected in sample order."""

    def __init__(self, parts: Sequence[Any]):
        self.parts = list(parts)

    def dot(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k`` for the samples of all micro-batches, ``[B, K]``."""
        return torch.cat([p.dot(vectors) for p in self.parts])


Deferred = (PerSampleGrads, DeferredConcat)
"""The deferred forms a provider or the accumulation leaves for the core to project."""


def directions(stat: Statistic, grad: Tensor, param: Tensor) -> Tensor:
    """The ``[K, *shape]`` directions of a projection statistic (``[1, *shape]``: ``g``)."""
    if stat.fn is None:
        return grad.unsqueeze(0)
    return stat.fn(grad, param.detach())


def project(
    stat: Statistic, value: PerSampleGrads | DeferredConcat, grad: Tensor, param: Tensor
) -> Tensor:
    """One parameter's projections: ``[B]`` for ``BATCH_PROJECTION``, ``[B, K]`` otherwise."""
    out = value.dot(directions(stat, grad, param))
    return (out[:, 0] if stat.fn is None else out).detach()


def resolve_projections(
    statistics: dict[tuple[str, str], list[Any]],
    grads: Sequence[Tensor],
    params: Sequence[Tensor],
    declared: Sequence[Any],
    missing: dict[tuple[str, str], str],
) -> None:
    """Replace deferred projections by their values on the final gradient (in place).

    ``declared``: the step's statistics; a statistic whose directions failed is dropped
    from ``statistics`` and reported in ``missing``.
    """
    for stat in declared:
        if stat.combine != "project":
            continue
        values = statistics.get(stat.identity)
        if values is None:
            continue
        try:
            for i, v in enumerate(values):
                if isinstance(v, Deferred):
                    values[i] = project(stat, v, grads[i], params[i])
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:  # plugin code: the statistic is missing, training goes on
            del statistics[stat.identity]
            missing[stat.identity] = failed_directions(stat, err)


def failed_directions(stat: Any, err: BaseException) -> str:
    """The message recorded when a projection's directions could not be computed."""
    return f"{stat.describe()}: computing its projection directions failed: {err!r}"
