"""Elementwise affine normalization: ``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.GroupNorm``.

With the normalized input ``x_hat`` (recomputed from the layer input, Ba et al., 2016,
"Layer normalization"; Zhang & Sennrich, 2019, "Root mean square layer normalization"; Wu
& He, 2018, "Group normalization") and ``y = gamma * x_hat + beta``, the per-sample
gradients are sums over every axis that is neither the batch nor the parameter's:

    g_n(gamma) = sum_t d_nt * x_hat_nt,    g_n(beta) = sum_t d_nt.

They are small (the parameter's size per sample) and kept dense.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from cockpit_core import DenseGrads, PerSampleGrads
from cockpit_hooks.rules.base import Piece, Rule, Use, batch_first, first_input, sum_over_middle

_RMS_NORM = getattr(torch.nn, "RMSNorm", None)


class AffineNormRule(Rule):
    """Shared part: keep the input, recompute ``x_hat``, reduce ``d`` and ``d * x_hat``."""

    def uses(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Tensor
    ) -> list[Use]:
        """The layer input; the output's gradient completes the use."""
        params = tuple((module, n) for n, _ in module.named_parameters(recurse=False))
        return [Use(params, first_input(args, kwargs).detach(), output)]

    def normalized(self, module: torch.nn.Module, x: Tensor) -> Tensor:
        """``x_hat``, shaped like ``x``."""
        raise NotImplementedError

    def reduce(self, module: torch.nn.Module, t: Tensor) -> Tensor:
        """Sum ``t`` (shaped like the input) down to ``[B, *parameter shape]``."""
        raise NotImplementedError

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """``sum_t d_nt * x_hat_nt`` for the weight, ``sum_t d_nt`` for the bias."""
        out = None
        for x, grad in pieces:
            batch_first(x, batch_size, f"the input of {type(owner).__name__}")
            d = grad * batch_size
            term = d * self.normalized(owner, x) if attr == "weight" else d
            part = self.reduce(owner, term)
            out = part if out is None else out + part
        assert out is not None, "the provider passes at least one piece"
        return DenseGrads(out)


class LayerNormRule(AffineNormRule):
    """``nn.LayerNorm`` (and ``nn.RMSNorm``) over the last ``len(normalized_shape)`` axes."""

    modules = (torch.nn.LayerNorm,) + ((_RMS_NORM,) if _RMS_NORM is not None else ())

    def normalized(self, module: torch.nn.Module, x: Tensor) -> Tensor:  # noqa: D102
        if isinstance(module, torch.nn.LayerNorm):
            return F.layer_norm(x, module.normalized_shape, None, None, module.eps)
        rms = cast("torch.nn.RMSNorm", module)  # the rule's other module type
        return F.rms_norm(x, rms.normalized_shape, None, rms.eps)

    def reduce(self, module: torch.nn.Module, t: Tensor) -> Tensor:  # noqa: D102
        norm = cast("torch.nn.LayerNorm | torch.nn.RMSNorm", module)  # the rule's modules
        return sum_over_middle(t, keep_last=len(norm.normalized_shape))


class GroupNormRule(AffineNormRule):
    """``nn.GroupNorm`` on ``[B, C, *spatial]``: one ``gamma``, ``beta`` entry per channel."""

    modules = (torch.nn.GroupNorm,)

    def normalized(self, module: torch.nn.Module, x: Tensor) -> Tensor:  # noqa: D102
        norm = cast(torch.nn.GroupNorm, module)  # the rule's module type
        return F.group_norm(x, norm.num_groups, None, None, norm.eps)

    def reduce(self, module: torch.nn.Module, t: Tensor) -> Tensor:  # noqa: D102
        return sum_over_spatial(t)


def sum_over_spatial(t: Tensor) -> Tensor:
    """``[B, C, *spatial]`` summed down to ``[B, C]`` (per channel)."""
    return t.sum(dim=tuple(range(2, t.dim()))) if t.dim() > 2 else t
