"""Per-sample gradients and curvature diagonals of convolution weights from unfolded inputs.

For a convolution ``Y_n = W * X_n`` with the input unfolded into patches ``U_n``
(``[C_in prod(k), L]``, ``L`` output positions) and the output gradient ``D_n``
(``[C_out, L]``), the per-sample weight gradient is

    g_n(W) = D_n U_n^T    (``[C_out, C_in prod(k)]``),

one batched product (Dangel et al., 2020, "BackPACK: Packing more into backprop", App. A;
Grosse & Martens, 2016, "A Kronecker-factored approximate curvature method for convolution
layers"). String padding (``"same"``) and non-zero padding modes (``"reflect"``, ...) are
applied to the input explicitly before unfolding, as ``nn.Conv1d``/``nn.Conv2d`` do.

The curvature diagonals (Hessian, GGN) of a convolution weight are ``sum_v sum_n (S_vn
U_n^T)^2`` with ``S`` a backpropagated symmetric factor ``[V, B, C_out, *output]``
(Dangel et al., 2020, Sec. 3): :func:`conv_weight_diagonal` computes it with the same
strided patches, a block of samples at a time. Only ungrouped convolutions are covered.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from cockpit_core.statistics import per_sample

_EINSUM = {1: ("nol,ncli->noci", "nol,ncli->oci"), 2: ("nohw,nchwij->nocij", "nohw,nchwij->ocij")}
_CURVATURE_EINSUM = {1: "nml,ncli->nmci", 2: "nmhw,nchwij->nmcij"}
_CONV = {1: F.conv1d, 2: F.conv2d}
_Conv = torch.nn.Conv1d | torch.nn.Conv2d  # the convolutions the unfolded computation covers


def supported_conv(module: torch.nn.Module, inputs: Tensor | None = None) -> str | None:
    """Why the unfolded computation cannot handle ``module``, or ``None`` if it can."""
    if not isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d)):
        return f"{type(module).__name__} is not nn.Conv1d or nn.Conv2d"
    if module.groups != 1:
        return f"grouped convolution (groups={module.groups})"
    spatial = 1 if isinstance(module, torch.nn.Conv1d) else 2
    if inputs is not None and inputs.dim() != spatial + 2:
        return "input without a batch axis"
    return None


class ConvWeightFactors:
    """Input ``X`` (padded as the convolution pads it) and output gradient ``D`` of a convolution.

    ``D = scale * grad_outputs``; the product is formed a block of samples at a time.

    Args:
        module: The ``nn.Conv1d``/``nn.Conv2d`` (kernel size, dilation and stride are read).
        inputs: Its input ``[B, C_in, *spatial]``.
        grad_outputs: The gradient w.r.t. its output ``[B, C_out, *spatial']``.

    """

    def __init__(self, module: _Conv, inputs: Tensor, grad_outputs: Tensor):
        dtype = per_sample.reduction_dtype(inputs, grad_outputs)
        self.inputs = _padded(module, inputs.to(dtype))
        self.grad_outputs = grad_outputs.to(dtype)
        self.scale = 1.0
        self.kernel_size = tuple(module.kernel_size)
        self.dilation = tuple(module.dilation)
        self.stride = tuple(module.stride)
        self.spatial = len(self.kernel_size)

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

        Shape ``[stop - start, C_out, C_in, *kernel]``. The patches ``U_n`` are a strided
        view of the padded input (``Tensor.unfold``), contracted with ``D`` by one
        ``einsum``; ``F.unfold`` (im2col) gave the same values but was up to 10x slower
        with two threads on a busy CPU.
        """
        d = self._d(start, stop)
        return torch.einsum(_EINSUM[self.spatial][0], d, self._patches()[start:stop])

    def sample_bytes(self) -> int:
        """Bytes that :meth:`materialize` forms per sample: ``g_n`` and its patches ``U_n``.

        ``(C_out + L) C_in prod(k)`` elements, ``L`` output positions (the einsum copies the
        strided patches into a ``[L, C_in prod(k)]`` matrix per sample).
        """
        d = self.grad_outputs
        row = self.inputs.shape[1] * _prod(self.kernel_size)
        return (d.shape[1] + _prod(d.shape[2:])) * row * d.element_size()

    def summed(self) -> Tensor:
        """``sum_n g_n(W)`` (one contraction, no per-sample tensor)."""
        return torch.einsum(_EINSUM[self.spatial][1], self._d(), self._patches())

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
            conv = _CONV[self.spatial](x, weight, None, self.stride, 0, self.dilation)
            conv = conv[(slice(None), slice(None), *(slice(0, n) for n in d.shape[2:]))]
            conv = conv.reshape(x.shape[0], k, -1)
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
        # [B, C_in, *out, *kernel]; positions beyond the output (stride) are cut off
        cut = (slice(None), slice(None), *(slice(0, n) for n in self.grad_outputs.shape[2:]))
        return patches[cut]


def _padded(module: _Conv, inputs: Tensor) -> Tensor:
    """The input as the convolution sees it: with its padding (any mode) applied."""
    padding = module.padding
    if isinstance(padding, str) or module.padding_mode != "zeros":
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        return F.pad(inputs, module._reversed_padding_repeated_twice, mode=mode)
    if any(padding):
        return F.pad(inputs, [p for p in reversed(padding) for _ in (0, 1)])
    return inputs


def _prod(values: Iterable[int]) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


CURVATURE_BLOCK = 1 << 22
"""Elements formed per block of samples by :func:`conv_weight_diagonal` (16 MiB of float32):
the block's ``[samples, V C_out, C_in k_h k_w]`` products, its slice of the factor and its
patches. A whole-batch copy of ``S`` (256 MiB for the first 3c3d layer) cost about as much,
in copying and page faults, as the products themselves (``benchmarks/results/analysis.md``)."""


def conv_weight_diagonal(module: _Conv, inputs: Tensor, factor: Tensor) -> Tensor:
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
        js = torch.einsum(
            _CURVATURE_EINSUM[factors.spatial], s_block, patches[start : start + block]
        )
        out += js.pow_(2).sum(0)
    return out.view(v, c_out, *module.weight.shape[1:]).sum(0)


class ConvGrads(per_sample.PerSampleGrads):
    """A convolution's weight, ``g_n = D_n U_n^T``, formed only on demand.

    Args:
        factors: The padded input and the output gradient of each sample's own loss
            (:class:`~cockpit_core.statistics.conv.ConvWeightFactors`).

    """

    closed_forms = frozenset({"dot"})

    def __init__(self, factors: ConvWeightFactors):
        self.factors: ConvWeightFactors | None = factors  # None once the gradients are formed
        self._grads: per_sample.DenseGrads | None = None
        self._blocks: list[Tensor] | None = None
        self._batch = int(factors.grad_outputs.shape[0])

    @property
    def batch_size(self) -> int:  # noqa: D102
        return self._batch

    def _factors(self) -> ConvWeightFactors:
        # freed only once the gradients are formed or kept, after which nothing asks for them
        assert self.factors is not None
        return self.factors

    def _materialized(self) -> per_sample.DenseGrads:
        if self._grads is None:
            kept, self._blocks = self._blocks, None
            whole = torch.cat(kept) if kept else self._factors().materialize()
            self._grads = per_sample.DenseGrads(whole)
            self.factors = None  # not needed any more: frees the scaled output gradient
        return self._grads

    def batch_l2(self) -> Tensor:  # noqa: D102
        return self._materialized().batch_l2()

    def batch_dot(self) -> Tensor:  # noqa: D102
        return self._materialized().batch_dot()

    def sum_grad_squared(self) -> Tensor:  # noqa: D102
        return self._materialized().sum_grad_squared()

    def materialize(self) -> Tensor:
        """``[B, C_out, C_in, *kernel]`` (formed once, on first use)."""
        return self._materialized().grads

    def blocks(self, max_bytes: int | None = None, keep: bool = False) -> Iterator[Tensor]:
        """Blocks of samples (with their patches, see ``ConvWeightFactors.sample_bytes``).

        With ``keep``, the blocks are kept for :meth:`dot` (projections after backward
        then need no convolution).
        """
        if self._grads is not None:
            yield self._grads.grads
            return
        if self._blocks is not None:
            yield from self._blocks
            return
        size = self._block_size(max_bytes, self._factors().sample_bytes())
        kept = []
        for start in range(0, max(self._batch, 1), size):
            block = self._factors().materialize(start, start + size)
            if keep:
                kept.append(block)
            yield block
        if keep:
            self._blocks, self.factors = kept, None

    def mean(self) -> Tensor:
        """``(1/B) sum_n g_n``, without the per-sample tensor unless it exists already."""
        if self._grads is not None:
            return self._grads.mean()
        if self._blocks is not None:
            return torch.stack([block.sum(0) for block in self._blocks]).sum(0) / self._batch
        return self._factors().summed() / self._batch

    def dot(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k``, ``[B, K]``: from the per-sample gradients if formed, else by convolution."""
        if self._grads is not None:
            return self._grads.dot(vectors)
        if self._blocks is not None:
            return torch.cat([per_sample.DenseGrads(block).dot(vectors) for block in self._blocks])
        return self._factors().dot(vectors, per_sample.BLOCK_BYTES)
