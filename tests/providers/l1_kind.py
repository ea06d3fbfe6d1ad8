"""A plugin that registers a new statistic kind: per-sample L1 norms of the gradients."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from cockpit_core import PerSampleGrads, StatisticKind, hookimpl


def batch_l1(grads: PerSampleGrads, statistic: Any, param: Tensor) -> Tensor:
    """``sum_j |g_n[j]|`` per sample, ``[B]``.

    The core calls it on blocks of samples (a :class:`~cockpit_core.DenseGrads` each) and
    concatenates the blocks (``combine="gather"``), so it may materialize what it gets.
    """
    return grads.materialize().flatten(1).abs().sum(1)


BATCH_L1 = StatisticKind(
    "batch_l1",
    per_sample=True,
    combine="gather",
    description="per-sample L1 norms sum_j |g_n[j]|, [B]",
    from_per_sample=batch_l1,
    sample_shape=lambda param: (),  # one number per sample, 0 for a zero gradient
)


@hookimpl
def register_statistic_kinds(register):
    """Register :data:`BATCH_L1`."""
    register(BATCH_L1)
