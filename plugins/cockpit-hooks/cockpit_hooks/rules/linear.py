"""``nn.Linear`` with any number of leading dimensions: ``y = x W^T + b``.

For an input ``a_n`` of sample ``n`` (``[in]``, or ``[T, in]`` with any leading axes
flattened into ``T``) and the gradient ``d_n`` of its own loss w.r.t. the output, the
per-sample gradients are (Goodfellow, 2015, "Efficient per-example gradient computations")

    g_n(W) = sum_t d_nt a_nt^T,    g_n(b) = sum_t d_nt,

kept factored (:class:`~cockpit_core.OuterProductGrads`). A layer used several times in
one forward pass contributes one term per use (the uses are concatenated along ``T``).
The helpers also serve weights whose rows are computed by separate products (the packed
input projection of attention).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from cockpit_core import DenseGrads, OuterProductGrads, PerSampleGrads
from cockpit_hooks.rules.base import Piece, Rule, Use, batch_first, first_input, sum_over_middle


@dataclass
class LinearInput:
    """The input of one product ``y = a W[rows]^T + b[rows]``, batch first.

    Attributes:
        inputs: ``[B, ..., in]``.
        rows: The rows of the weight the product used; ``None``: all.
        to_batch_first: Turns the output's gradient into ``[B, ..., out]``.
        label: The module, for error messages.
        bias_rows: The rows of the bias it used (default: ``rows``).

    """

    inputs: Tensor
    rows: slice | None = None
    to_batch_first: Callable[[Tensor], Tensor] = lambda g: g
    label: str = "the input of a linear layer"
    bias_rows: slice | None = None

    def __post_init__(self) -> None:
        if self.bias_rows is None:
            self.bias_rows = self.rows


def _factors(pieces: list[Piece], batch_size: int) -> list[tuple[LinearInput, Tensor, Tensor]]:
    out = []
    for saved, grad in pieces:
        a = batch_first(saved.inputs, batch_size, saved.label)
        d = batch_first(saved.to_batch_first(grad), batch_size, f"the output of {saved.label}")
        out.append((saved, a, d * batch_size))
    return out


def _outer(parts: list[tuple[Tensor, Tensor]]) -> OuterProductGrads:
    """One factored object for several uses: their inputs concatenated along ``T``."""
    if len(parts) == 1:
        return OuterProductGrads(*parts[0])
    a = torch.cat([x.reshape(x.shape[0], -1, x.shape[-1]) for x, _ in parts], dim=1)
    d = torch.cat([g.reshape(g.shape[0], -1, g.shape[-1]) for _, g in parts], dim=1)
    return OuterProductGrads(a, d)


def weight_grads(pieces: list[Piece], batch_size: int, shape: torch.Size) -> PerSampleGrads:
    """Per-sample gradients of a weight ``[out, in]`` from the products that used it.

    A product that used only some rows (attention's packed input projection in
    cross-attention) contributes ``d_nt`` zero-padded to every row: ``g_n = sum_t
    pad(d_nt) a_nt^T`` stays one factored :class:`~cockpit_core.OuterProductGrads`, so its
    norms, Gram matrix and projections keep their closed forms.
    """
    parts = []
    for saved, a, d in _factors(pieces, batch_size):
        if saved.rows is not None:
            full = d.new_zeros(*d.shape[:-1], shape[0])
            full[..., saved.rows] = d
            d = full
        parts.append((a, d))
    return _outer(parts)


def bias_grads(pieces: list[Piece], batch_size: int, shape: torch.Size) -> PerSampleGrads:
    """Per-sample gradients of a bias ``[out]``: ``sum_t d_nt`` of every product that used it."""
    factors = _factors(pieces, batch_size)
    out = None
    for saved, _, d in factors:
        part = sum_over_middle(d, keep_last=1)
        if saved.bias_rows is not None:
            full = torch.zeros(batch_size, *shape, dtype=part.dtype, device=part.device)
            full[:, saved.bias_rows] = part
            part = full
        out = part if out is None else out + part
    assert out is not None, "the provider passes at least one piece"
    return DenseGrads(out)


class LinearRule(Rule):
    """``nn.Linear`` (and attention's ``NonDynamicallyQuantizableLinear``)."""

    modules: ClassVar[tuple[type, ...]] = (
        torch.nn.Linear,
        torch.nn.modules.linear.NonDynamicallyQuantizableLinear,
    )

    def uses(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Tensor
    ) -> list[Use]:
        """The layer input; the output's gradient completes the use."""
        label = f"the input of {type(module).__name__}"
        params = tuple((module, n) for n, _ in module.named_parameters(recurse=False))
        return [Use(params, LinearInput(first_input(args, kwargs).detach(), label=label), output)]

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """``sum_t d_nt a_nt^T`` for the weight, ``sum_t d_nt`` for the bias."""
        shape = getattr(owner, attr).shape
        if attr == "weight":
            return weight_grads(pieces, batch_size, shape)
        return bias_grads(pieces, batch_size, shape)
