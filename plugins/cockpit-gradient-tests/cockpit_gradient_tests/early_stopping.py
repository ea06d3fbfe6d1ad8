"""Evidence-based early-stopping criterion (Mahsereci et al., 2017)."""

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


class EarlyStoppingConfig(QuantityConfig):
    """Options of :class:`EarlyStopping`."""

    epsilon: float = Field(
        1e-5, ge=0, description=epsilon_field_description("the signal-to-noise ratio")
    )


class EarlyStopping(Quantity):
    """Evidence-based early-stopping criterion; training should stop when it exceeds 0.

    Mahsereci, Balles, Lassner & Hennig (2017), "Early stopping without a validation set",
    Eq. (7): stop when the mini-batch gradient is no longer distinguishable from the zero
    gradient given the gradient noise,

        1 - (B / D) sum_d g_d^2 / (var_d + epsilon) > 0,
        var_d = (sum_n g_{n,d}^2 - B g_d^2) / (B - 1)   (sample variance).

    The criterion is a statistical test on the gradients alone, so it is computed for any
    optimizer (Cockpit 1.0.2 refuses anything but plain SGD). It says whether the
    *gradient of the loss* still carries signal at the current parameters; with momentum
    or Adam the optimizer may move differently, but a value above 0 still means the
    mini-batch gradient is consistent with a local minimum of the training loss.

    Output: ``{"total": criterion over all D entries, "per_param": [criterion of each
    parameter's entries alone]}``.
    """

    name = "early_stopping"
    shards = True  # FSDP2: rows of ctx.grads; _common sums over processes
    Config = EarlyStoppingConfig
    config: EarlyStoppingConfig
    REQUIREMENTS = Requirements(statistics=(SUM_GRAD_SQUARED,))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": float, "per_param": np.ndarray}`` of the criterion."""
        batch_size, groups, grad_sq, var = elementwise_variances(ctx, self.key, unbiased=True)
        snr = torch._foreach_div(grad_sq, torch._foreach_add(var, self.config.epsilon))
        sums, sizes = groups.means(snr)
        return layered(1 - batch_size * sums.sum() / sizes.sum(), 1 - batch_size * sums / sizes)
