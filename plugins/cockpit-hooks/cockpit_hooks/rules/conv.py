"""``nn.Conv1d`` and ``nn.Conv2d``: ``g_n(W) = D_n U_n^T`` from the unfolded input.

The weight's per-sample gradients stay factored (:class:`~cockpit_core.ConvGrads`, formed
a block of samples at a time when a statistic needs every element; see
:mod:`cockpit_core.statistics.conv`); the bias's are ``sum_l D_n[:, l]``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from cockpit_core import ConvGrads, DenseGrads, PerSampleGrads
from cockpit_core.statistics.conv import ConvWeightFactors, supported_conv
from cockpit_hooks.rules.base import Piece, Rule, Use, batch_first, first_input


class ConvRule(Rule):
    """Ungrouped ``nn.Conv1d``/``nn.Conv2d`` (any stride, dilation, padding and padding mode)."""

    modules = (torch.nn.Conv1d, torch.nn.Conv2d)
    generic_fallback = True  # grouped (depthwise) convolutions: the generic rule

    def supports(self, module: torch.nn.Module) -> str | None:
        """Only ``groups=1``."""
        return supported_conv(module)

    def uses(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Tensor
    ) -> list[Use]:
        """The layer input; the output's gradient completes the use."""
        params = tuple((module, n) for n, _ in module.named_parameters(recurse=False))
        return [Use(params, first_input(args, kwargs).detach(), output)]

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """Factored weight gradients (one use), dense sums otherwise; bias: ``sum_l D_n``."""
        label = f"the input of {type(owner).__name__}"
        for x, _ in pieces:  # the bias too: an unbatched input of C == B channels
            batch_first(x, batch_size, label)
            why = supported_conv(owner, x)
            if why is not None:
                raise ValueError(f"{type(owner).__name__}: {why}")
        if attr == "bias":
            total = None
            for _, grad in pieces:
                part = (grad * batch_size).flatten(2).sum(2)
                total = part if total is None else total + part
            assert total is not None, "the provider passes at least one piece"
            return DenseGrads(total)
        conv = cast("torch.nn.Conv1d | torch.nn.Conv2d", owner)  # the rule's module types
        grads = [ConvGrads(ConvWeightFactors(conv, x, g).scaled(batch_size)) for x, g in pieces]
        if len(grads) == 1:
            return grads[0]
        return DenseGrads(cast(Tensor, sum(g.materialize() for g in grads)))  # two or more
