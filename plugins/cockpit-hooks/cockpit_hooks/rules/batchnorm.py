"""BatchNorm in evaluation mode: an affine map per channel with fixed statistics.

With the running mean ``mu`` and variance ``sigma^2``, ``x_hat = (x - mu) / sqrt(sigma^2 +
eps)`` does not depend on the other samples, and ``y = gamma * x_hat + beta`` per channel
(Ioffe & Szegedy, 2015, "Batch normalization"), so, summed over the spatial axes,

    g_n(gamma) = sum_s d_ns * x_hat_ns,    g_n(beta) = sum_s d_ns.

In training mode the layer normalizes with the statistics of the batch itself, which mixes
the samples: per-sample gradients are not defined there, and the rule refuses each such
forward pass with that reason.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from cockpit_hooks.rules.base import Unsupported, Use
from cockpit_hooks.rules.norm import AffineNormRule, sum_over_spatial

TRAINING_MODE = (
    "in training mode BatchNorm normalizes with the statistics of the batch, which mixes "
    "the samples, so per-sample gradients are not defined; track per-sample quantities "
    "with the model in eval mode (model.eval()), or use GroupNorm/LayerNorm"
)


class BatchNormRule(AffineNormRule):
    """``nn.BatchNorm1d/2d/3d`` with running statistics, in evaluation mode."""

    modules = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)

    def supports(self, module: torch.nn.Module) -> str | None:
        """Running statistics are needed (without them even eval mode uses the batch's)."""
        if not module.track_running_stats or module.running_mean is None:
            return (
                "BatchNorm without running statistics (track_running_stats=False) always "
                "normalizes with the statistics of the batch, which mixes the samples"
            )
        return None

    def uses(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Tensor
    ) -> list[Use]:
        """The layer input, in eval mode; in training mode the pass is refused."""
        if module.training:
            raise Unsupported(TRAINING_MODE)
        return super().uses(module, args, kwargs, output)

    def normalized(self, module: torch.nn.Module, x: Tensor) -> Tensor:
        """``(x - mu) / sqrt(sigma^2 + eps)`` with the running statistics, per channel."""
        bn = cast(torch.nn.modules.batchnorm._BatchNorm, module)  # the rule's module types
        mean, var = bn.running_mean, bn.running_var
        assert mean is not None and var is not None, "supports() refuses no running statistics"
        shape = (1, -1) + (1,) * (x.dim() - 2)
        std = (var.view(shape) + bn.eps).sqrt()
        return (x - mean.view(shape)) / std

    def reduce(self, module: torch.nn.Module, t: Tensor) -> Tensor:  # noqa: D102
        return sum_over_spatial(t)
