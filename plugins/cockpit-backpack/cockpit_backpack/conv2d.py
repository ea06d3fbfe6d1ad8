"""Per-sample gradients of 2-D convolutions as batched matrix products (BackPACK ``BatchGrad``).

For a convolution ``Y_n = W * X_n`` with the input unfolded into patches ``U_n``
(``[C_in k_h k_w, L]``, ``L`` output positions, :func:`torch.nn.functional.unfold`) and
the output gradient ``D_n`` (``[C_out, L]``), the per-sample weight gradient is

    g_n(W) = D_n U_n^T    (``[C_out, C_in k_h k_w]``),

one batched matrix product (Dangel et al., 2020, "BackPACK: Packing more into backprop",
App. A; Grosse & Martens, 2016, "A Kronecker-factored approximate curvature method for
convolution layers"). BackPACK computes the same tensor with a grouped convolution over
a ``repeat``-ed copy of the input, which was 3-10x slower on the 3c3d network on a CPU.
String padding (``"same"``) and non-zero padding modes (``"reflect"``, ...) are applied to
the input explicitly before unfolding, as ``nn.Conv2d`` does; BackPACK 1.7.1 returned
wrong per-sample gradients for both (checked against an autograd loop over samples).
Grouped convolutions and subsampling use BackPACK's own computation.

The curvature diagonals (``DiagHessian``, ``DiagGGN*``) of a convolution weight are
``sum_v sum_n (S_vn U_n^T)^2`` with ``S`` the backpropagated symmetric factor ``[V, B,
C_out, H', W']`` (Dangel et al., 2020, Sec. 3). :func:`conv_weight_diagonal` computes it
with the same strided patches, ``V`` folded into the output channels, a block of samples
at a time; BackPACK's ``einsum`` over ``F.unfold`` output was the largest cost of the
``business`` preset on the 3c3d network.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from backpack.extensions.firstorder.batch_grad.conv2d import BatchGradConv2d
from backpack.extensions.secondorder.diag_ggn.conv2d import DiagGGNConv2d
from backpack.extensions.secondorder.diag_hessian.conv2d import DiagHConv2d
from torch import Tensor


class UnfoldConv2d(BatchGradConv2d):
    """``BatchGrad`` for ``nn.Conv2d`` that keeps the input and output gradient (factors).

    ``weight.grad_batch`` becomes a :class:`ConvWeightFactors`; the backend wraps it in
    :class:`~cockpit_core.backends.per_sample.ConvGrads`, which forms ``D_n U_n^T`` only
    when a statistic needs every element, and projects on given directions without it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._backpack_weight = self._make_param_function("weight")

    def weight(self, ext, module, g_inp, g_out, bp_quantities):  # noqa: D102 - BackPACK API
        if module.groups != 1 or module.input0.dim() != 4 or ext.get_subsampling() is not None:
            return self._backpack_weight(ext, module, g_inp, g_out, bp_quantities)
        return ConvWeightFactors(module, module.input0.detach(), g_out[0].detach())


class ConvWeightFactors:
    """Input ``X`` (padded as the convolution pads it) and output gradient ``D`` of a Conv2d.

    ``D = scale * grad_outputs``; the product is formed a block of samples at a time.

    Args:
        module: The convolution (kernel size, dilation and stride are read).
        inputs: Its input ``[B, C_in, H, W]``.
        grad_outputs: The gradient w.r.t. its output ``[B, C_out, H', W']``.

    """

    def __init__(self, module: torch.nn.Conv2d, inputs: Tensor, grad_outputs: Tensor):
        self.inputs = _padded(module, inputs)
        self.grad_outputs = grad_outputs
        self.scale = 1.0
        self.kernel_size = tuple(module.kernel_size)
        self.dilation = tuple(module.dilation)
        self.stride = tuple(module.stride)

    def scaled(self, factor: float) -> ConvWeightFactors:
        """The same factors with the output gradient multiplied by ``factor`` (no copy)."""
        out = object.__new__(ConvWeightFactors)
        out.__dict__.update(self.__dict__)
        out.scale = self.scale * factor
        return out

    def _d(self, start: int = 0, stop: int | None = None) -> Tensor:
        """``D`` of samples ``start <= n < stop``."""
        d = self.grad_outputs[start:stop]
        return d if self.scale == 1.0 else d * self.scale

    def materialize(self, start: int = 0, stop: int | None = None) -> Tensor:
        """``g_n(W) = D_n U_n^T`` for samples ``start <= n < stop`` (default: all).

        Shape ``[stop - start, C_out, C_in, k_h, k_w]``. The patches ``U_n`` are a strided
        view of the padded input (``Tensor.unfold``), contracted with ``D`` by one
        ``einsum``; ``F.unfold`` (im2col) gave the same values but was up to 10x slower
        with two threads on a busy CPU.
        """
        d = self._d(start, stop)
        return torch.einsum("nohw,nchwij->nocij", d, self._patches()[start:stop])

    def sample_bytes(self) -> int:
        """Bytes that :meth:`materialize` forms per sample: ``g_n`` and its patches ``U_n``.

        ``(C_out + L) C_in k_h k_w`` elements, ``L = H' W'`` output positions (the einsum
        copies the strided patches into a ``[L, C_in k_h k_w]`` matrix per sample).
        """
        d = self.grad_outputs
        row = self.inputs.shape[1] * self.kernel_size[0] * self.kernel_size[1]
        return (d.shape[1] + d.shape[2] * d.shape[3]) * row * d.element_size()

    def summed(self) -> Tensor:
        """``sum_n g_n(W)`` (one contraction, no per-sample tensor)."""
        return torch.einsum("nohw,nchwij->ocij", self._d(), self._patches())

    def dot(self, vectors: Tensor, max_bytes: int = 1 << 22) -> Tensor:
        """``g_n . V_k = sum D_n * conv(X_n, V_k)`` for ``vectors`` ``[K, *weight.shape]``: ``[B, K]``.

        One convolution with ``K C_out`` output channels instead of forming ``g_n``, a
        block of samples at a time so that its output (``K C_out L`` elements per sample)
        stays within ``max_bytes``; then one ``[K, C_out L] x [C_out L]`` product per sample.
        """
        k, c_out = vectors.shape[0], vectors.shape[1]
        weight = vectors.reshape(k * c_out, *vectors.shape[2:]).to(self.inputs.dtype)
        d = self.grad_outputs
        per_sample = k * d[0].numel() * d.element_size()
        size = max(1, max_bytes // max(per_sample, 1))
        out = []
        for start in range(0, max(d.shape[0], 1), size):
            x, d_block = self.inputs[start : start + size], self._d(start, start + size)
            conv = F.conv2d(x, weight, None, self.stride, 0, self.dilation)
            conv = conv[:, :, : d.shape[2], : d.shape[3]].reshape(x.shape[0], k, -1)
            out.append(torch.bmm(conv, d_block.reshape(x.shape[0], -1, 1))[:, :, 0])
        return out[0] if len(out) == 1 else torch.cat(out)

    def _patches(self) -> Tensor:
        patches = self.inputs
        for dim, (k, dilation, stride) in enumerate(
            zip(self.kernel_size, self.dilation, self.stride), start=2
        ):
            patches = patches.unfold(dim, (k - 1) * dilation + 1, stride)
            if dilation > 1:
                patches = patches[..., ::dilation]
        # [B, C_in, H', W', k_h, k_w]; positions beyond the output (stride) are cut off
        h_out, w_out = self.grad_outputs.shape[2], self.grad_outputs.shape[3]
        return patches[:, :, :h_out, :w_out]


def _padded(module: torch.nn.Conv2d, inputs: Tensor) -> Tensor:
    """The input as the convolution sees it: with its padding (any mode) applied."""
    padding = module.padding
    if isinstance(padding, str) or module.padding_mode != "zeros":
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        return F.pad(inputs, module._reversed_padding_repeated_twice, mode=mode)
    if any(padding):
        return F.pad(inputs, (padding[1], padding[1], padding[0], padding[0]))
    return inputs


def per_sample_conv2d_weight(module: torch.nn.Conv2d, inputs: Tensor, grad_out: Tensor) -> Tensor:
    """``g_n(W) = D_n U_n^T`` for every sample, shaped ``[B, *weight.shape]``."""
    return ConvWeightFactors(module, inputs.detach(), grad_out.detach()).materialize()


CURVATURE_BLOCK = 1 << 22
"""Elements formed per block of samples by :func:`conv_weight_diagonal` (16 MiB of float32):
the block's ``[samples, V C_out, C_in k_h k_w]`` products, its slice of the factor and its
patches. A whole-batch copy of ``S`` (256 MiB for the first 3c3d layer) cost about as much,
in copying and page faults, as the products themselves (``benchmarks/results/analysis.md``)."""


def conv_weight_diagonal(module: torch.nn.Conv2d, inputs: Tensor, factor: Tensor) -> Tensor:
    """``sum_v sum_n (S_vn U_n^T)^2`` for the symmetric factor ``S`` (``[V, B, *output]``).

    A block of samples at a time: the block's factor slice is laid out as ``[n, V C_out,
    L]`` (``V`` folded into the output channels) and contracted with its patches by one
    batched product, so no whole-batch copy of ``S`` is made.
    """
    factors = ConvWeightFactors(module, inputs.detach(), factor[0].detach())
    patches = factors._patches()
    v, batch, c_out = factor.shape[0], factor.shape[1], factor.shape[2]
    row, positions = module.weight[0].numel(), factor[0, 0, 0].numel()
    per_sample = v * c_out * (row + positions) + row * positions
    block = max(1, CURVATURE_BLOCK // max(per_sample, 1))
    s = factor.detach()
    out = torch.zeros(v * c_out, *module.weight.shape[1:], dtype=factor.dtype, device=factor.device)
    for start in range(0, batch, block):
        s_block = s[:, start : start + block].transpose(0, 1)
        s_block = s_block.reshape(s_block.shape[0], v * c_out, *factor.shape[3:])
        js = torch.einsum("nmhw,nchwij->nmcij", s_block, patches[start : start + block])
        out += js.pow_(2).sum(0)
    return out.view(v, c_out, *module.weight.shape[1:]).sum(0)


def _plain_conv(module: torch.nn.Module) -> bool:
    return module.groups == 1 and module.input0.dim() == 4


class DiagHConv2dFast(DiagHConv2d):
    """``DiagHessian`` for ``nn.Conv2d`` with :func:`conv_weight_diagonal`."""

    def weight(self, ext, module, g_inp, g_out, backproped):  # noqa: D102 - BackPACK API
        if not _plain_conv(module):
            return super().weight(ext, module, g_inp, g_out, backproped)
        diagonal = torch.zeros_like(module.weight)
        for factor, sign in zip(backproped["matrices"], backproped["signs"]):
            diagonal.add_(conv_weight_diagonal(module, module.input0, factor), alpha=sign)
        return diagonal


class DiagGGNConv2dFast(DiagGGNConv2d):
    """``DiagGGNExact``/``DiagGGNMC`` for ``nn.Conv2d`` with :func:`conv_weight_diagonal`."""

    def weight(self, ext, module, g_inp, g_out, backproped):  # noqa: D102 - BackPACK API
        if not _plain_conv(module):
            return super().weight(ext, module, g_inp, g_out, backproped)
        return conv_weight_diagonal(module, module.input0, backproped)
