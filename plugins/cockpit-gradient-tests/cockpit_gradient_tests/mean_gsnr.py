"""Mean gradient signal-to-noise ratio (Liu et al., 2020)."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from cockpit_core import (
    SUM_GRAD_SQUARED,
    Quantity,
    QuantityConfig,
    Requirements,
    StepContext,
    layered,
)
from cockpit_gradient_tests._common import elementwise_variances, epsilon_field_description


class MeanGSNRConfig(QuantityConfig):
    """Options of :class:`MeanGSNR`."""

    epsilon: float = Field(1e-5, ge=0, description=epsilon_field_description("the GSNR"))


class MeanGSNR(Quantity):
    """Mean gradient signal-to-noise ratio over all parameter entries.

    Liu et al. (2020), "Understanding why neural networks generalize well through GSNR of
    parameters", define the GSNR of a parameter entry ``d`` as the squared mean of its
    per-sample gradients over their variance. With the mini-batch estimates (population
    variance, dividing by ``B``, as Cockpit 1.0.2 does)

        var_d = (1/B) sum_n g_{n,d}^2 - g_d^2,    gsnr_d = g_d^2 / (var_d + epsilon),

    the value is ``(1/D) sum_d gsnr_d``. Large values mean the per-sample gradients agree
    (signal dominates noise); Liu et al. link a large GSNR to a small generalization gap.

    Output: ``{"total": mean over all D entries, "per_param": [mean over each parameter]}``.
    """

    name = "mean_gsnr"
    shards = True  # FSDP2: rows of ctx.grads; _common sums over processes
    Config = MeanGSNRConfig
    config: MeanGSNRConfig
    REQUIREMENTS = Requirements(statistics=(SUM_GRAD_SQUARED,))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": float, "per_param": np.ndarray}`` of the mean GSNR."""
        _, groups, grad_sq, var = elementwise_variances(ctx, self.key, unbiased=False)
        gsnr = torch._foreach_div(grad_sq, torch._foreach_add(var, self.config.epsilon))
        sums, sizes = groups.means(gsnr)
        return layered(sums.sum() / sizes.sum(), sums / sizes)
