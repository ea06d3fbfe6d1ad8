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

import torch
from torch import Tensor

from cockpit_core import DenseGrads, PerSampleGrads
from cockpit_hooks.rules.base import Piece, Rule, Unsupported, Use, batch_first, first_input

TRAINING_MODE = (
    "in training mode BatchNorm normalizes with the statistics of the batch, which mixes "
    "the samples, so per-sample gradients are not defined; track per-sample quantities "
    "with the model in eval mode (model.eval()), or use GroupNorm/LayerNorm"
)


class BatchNormRule(Rule):
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

    def uses(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Tensor) -> list[Use]:
        """The layer input, in eval mode; in training mode the pass is refused."""
        if module.training:
            raise Unsupported(TRAINING_MODE)
        params = tuple((module, n) for n, _ in module.named_parameters(recurse=False))
        return [Use(params, first_input(args, kwargs).detach(), output)]

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """``sum_s d_ns * x_hat_ns`` for the weight, ``sum_s d_ns`` for the bias."""
        out = None
        for x, grad in pieces:
            batch_first(x, batch_size, f"the input of {type(owner).__name__}")
            d = grad * batch_size
            if attr == "weight":
                shape = (1, -1) + (1,) * (x.dim() - 2)
                mean = owner.running_mean.view(shape)
                std = (owner.running_var.view(shape) + owner.eps).sqrt()
                d = d * ((x - mean) / std)
            part = d.sum(dim=tuple(range(2, d.dim()))) if d.dim() > 2 else d
            out = part if out is None else out + part
        return DenseGrads(out)
