"""BackPACK module extensions for ``nn.Conv2d`` built on the core's unfolded convolution math.

``BatchGrad``: BackPACK computes a convolution's per-sample weight gradients with a
grouped convolution over a ``repeat``-ed copy of the input, which was 3-10x slower on the
3c3d network on a CPU, and returned wrong values for string padding (``"same"``) and
non-zero padding modes in BackPACK 1.7.1 (checked against an autograd loop over samples).
:class:`UnfoldConv2d` keeps the input and the output gradient instead
(:class:`~cockpit_core.statistics.conv.ConvWeightFactors`), so that statistics form
``g_n = D_n U_n^T`` only when they need every element.

``DiagHessian``/``DiagGGN*``: BackPACK's ``einsum`` over ``F.unfold`` output was the
largest cost of the ``business`` preset on the 3c3d network;
:func:`~cockpit_core.statistics.conv.conv_weight_diagonal` computes the same diagonal a
block of samples at a time. Grouped convolutions and subsampling use BackPACK's own code.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from backpack.extensions.backprop_extension import BackpropExtension
from backpack.extensions.firstorder.batch_grad.conv2d import BatchGradConv2d
from backpack.extensions.secondorder.diag_ggn.conv2d import DiagGGNConv2d
from backpack.extensions.secondorder.diag_hessian.conv2d import DiagHConv2d
from torch import Tensor

from cockpit_core.statistics.conv import ConvWeightFactors, conv_weight_diagonal


class UnfoldConv2d(BatchGradConv2d):  # type: ignore[misc]  # BackPACK has no type information
    """``BatchGrad`` for ``nn.Conv2d`` that keeps the input and output gradient (factors).

    ``weight.grad_batch`` becomes a :class:`ConvWeightFactors`; the provider wraps it in
    :class:`~cockpit_core.statistics.conv.ConvGrads`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._backpack_weight = self._make_param_function("weight")

    def weight(  # noqa: D102 - BackPACK API
        self,
        ext: BackpropExtension,
        module: torch.nn.Conv2d,
        g_inp: tuple[Tensor, ...],
        g_out: tuple[Tensor, ...],
        bp_quantities: object,
    ) -> ConvWeightFactors | Tensor:
        if (
            module.groups != 1
            or layer_input(module).dim() != 4
            or ext.get_subsampling() is not None
        ):
            grad_batch: Tensor = self._backpack_weight(ext, module, g_inp, g_out, bp_quantities)
            return grad_batch
        return ConvWeightFactors(module, layer_input(module).detach(), g_out[0].detach())


def layer_input(module: torch.nn.Module) -> Tensor:
    """``module.input0``: the layer input, which BackPACK stores on the module."""
    return cast(Tensor, module.input0)  # nn.Module's __getattr__ says Tensor | Module


def _plain_conv(module: torch.nn.Conv2d) -> bool:
    return module.groups == 1 and layer_input(module).dim() == 4


class DiagHConv2dFast(DiagHConv2d):  # type: ignore[misc]  # as UnfoldConv2d
    """``DiagHessian`` for ``nn.Conv2d`` with :func:`conv_weight_diagonal`."""

    def weight(  # noqa: D102 - BackPACK API
        self,
        ext: BackpropExtension,
        module: torch.nn.Conv2d,
        g_inp: tuple[Tensor, ...],
        g_out: tuple[Tensor, ...],
        backproped: dict[str, list[Any]],
    ) -> Tensor:
        if not _plain_conv(module):
            out: Tensor = super().weight(ext, module, g_inp, g_out, backproped)
            return out
        diagonal = torch.zeros_like(module.weight)
        for factor, sign in zip(backproped["matrices"], backproped["signs"]):
            diagonal.add_(conv_weight_diagonal(module, layer_input(module), factor), alpha=sign)
        return diagonal


class DiagGGNConv2dFast(DiagGGNConv2d):  # type: ignore[misc]  # as UnfoldConv2d
    """``DiagGGNExact``/``DiagGGNMC`` for ``nn.Conv2d`` with :func:`conv_weight_diagonal`."""

    def weight(  # noqa: D102 - BackPACK API
        self,
        ext: BackpropExtension,
        module: torch.nn.Conv2d,
        g_inp: tuple[Tensor, ...],
        g_out: tuple[Tensor, ...],
        backproped: Tensor,
    ) -> Tensor:
        if not _plain_conv(module):
            out: Tensor = super().weight(ext, module, g_inp, g_out, backproped)
            return out
        return conv_weight_diagonal(module, layer_input(module), backproped)
