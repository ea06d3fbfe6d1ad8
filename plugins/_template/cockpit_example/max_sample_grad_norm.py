"""The largest per-sample gradient norm of a mini-batch."""

import math

from cockpit_core import BATCH_L2, Quantity, QuantityConfig, Requirements, StepContext
from pydantic import Field


class MaxSampleGradNormConfig(QuantityConfig):
    """Options of :class:`MaxSampleGradNorm` (plus the schedule options every quantity has)."""

    relative: bool = Field(False, description="Divide by the norm of the mini-batch gradient.")


class MaxSampleGradNorm(Quantity):
    """Largest per-sample gradient norm ``max_n ||g_n||`` (optionally divided by ``||g||``).

    ``g_n`` is the gradient of sample ``n``'s own loss and ``g = mean_n g_n``. Per-sample
    gradient norms are what differentially private SGD clips (Abadi et al., "Deep Learning
    with Differential Privacy", CCS 2016); their maximum shows outlier samples.
    ``||g_n||^2`` is the sum over parameters of the ``BATCH_L2`` statistic, which the core
    computes once per step for every quantity that declares it.
    """

    name = "max_sample_grad_norm"
    Config = MaxSampleGradNormConfig
    REQUIREMENTS = Requirements(statistics=(BATCH_L2,))

    def compute(self, ctx: StepContext) -> float:
        """Return ``max_n ||g_n||``, divided by ``||g||`` if ``relative``."""
        squared = sum(ctx.stat(BATCH_L2))  # [B]: ||g_n||^2 summed over parameters
        value = math.sqrt(float(squared.max()))
        if self.config.relative:
            grad_norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in ctx.grads))
            value /= grad_norm
        return value
