"""Functional calls with a module's own parameters: ``F.linear``, ``F.layer_norm``, ``F.rms_norm``, ``F.embedding``.

Hand-written modules often call a functional with their own parameters instead of
holding an ``nn.Linear``/``nn.LayerNorm`` (nanoGPT's ``LayerNorm`` class calls
``F.layer_norm(x, shape, self.weight, self.bias)``; a gated MLP calls ``F.linear(x,
self.w_up)``). While the provider observes a forward pass it sees these calls
(:mod:`cockpit_hooks.broadcast`), records the call's input and hooks its output; the
per-sample gradients then follow the formulas of the module rules (Goodfellow, 2015,
"Efficient per-example gradient computations"; Ba et al., 2016, "Layer normalization";
Zhang & Sennrich, 2019, "Root mean square layer normalization"):

    F.linear:          g_n(W) = sum_t d_nt x_nt^T,      g_n(b) = sum_t d_nt
    F.layer_norm/rms:  g_n(gamma) = sum_t d_nt * x_hat_nt,  g_n(beta) = sum_t d_nt
    F.embedding:       g_n(W)[v] = sum_{t: i_nt = v} d_nt

with ``d_n`` the gradient of sample ``n``'s own loss w.r.t. the call's output. The call
itself runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cockpit_core import (
    DenseGrads,
    EmbeddingGrads,
    OuterProductGrads,
    PerSampleGrads,
    TiedGrads,
)
from cockpit_hooks.rules.base import Piece, Rule, batch_first, sum_over_middle

_SIGNATURES: dict[Any, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    F.linear: ("linear", ("input", "weight", "bias"), ("weight", "bias")),
    F.layer_norm: (
        "layer_norm",
        ("input", "normalized_shape", "weight", "bias", "eps"),
        ("weight", "bias"),
    ),
    F.embedding: (
        "embedding",
        (
            "input",
            "weight",
            "padding_idx",
            "max_norm",
            "norm_type",
            "scale_grad_by_freq",
            "sparse",
        ),
        ("weight",),
    ),
}
if hasattr(F, "rms_norm"):
    _SIGNATURES[F.rms_norm] = (
        "rms_norm",
        ("input", "normalized_shape", "weight", "eps"),
        ("weight",),
    )


@dataclass
class FunctionalCall:
    """One call of a supported functional.

    Attributes:
        name: ``"linear"``, ``"layer_norm"``, ``"rms_norm"`` or ``"embedding"``.
        arguments: Its arguments by name (tensors as given).
        roles: For each tracked parameter of the call (by attribute), its argument name
            (``"weight"`` or ``"bias"``); filled by the provider.

    """

    name: str
    arguments: dict[str, Any]
    roles: dict[str, str] = field(default_factory=dict)

    @property
    def input(self) -> Tensor:
        """The call's input (batch first)."""
        value: Tensor = self.arguments["input"]
        return value

    def parameters(self) -> dict[str, Tensor]:
        """``argument name -> tensor`` of the arguments that can be parameters."""
        names = _SIGNATURES_BY_NAME[self.name]
        return {n: self.arguments[n] for n in names if isinstance(self.arguments.get(n), Tensor)}

    def unsupported(self) -> str | None:
        """Why the call's per-sample gradients cannot be formed, or ``None``."""
        a = self.arguments
        if self.name == "embedding" and (a.get("scale_grad_by_freq") or a.get("sparse")):
            return "F.embedding with scale_grad_by_freq or sparse mixes or sparsifies gradients"
        if self.name == "embedding" and a.get("max_norm") is not None:
            return "F.embedding with max_norm renormalizes the weight in place"
        return None

    def detached(self) -> FunctionalCall:
        """The call with its input detached (what the rule keeps until ``backward``)."""
        arguments = dict(self.arguments)
        arguments["input"] = self.input.detach()
        return FunctionalCall(self.name, arguments, dict(self.roles))


_SIGNATURES_BY_NAME = {name: params for name, _, params in _SIGNATURES.values()}


def bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FunctionalCall | None:
    """``func(*args, **kwargs)`` as a :class:`FunctionalCall`, if ``func`` is supported."""
    signature = _SIGNATURES.get(func)
    if signature is None:
        return None
    name, names, _ = signature
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    arguments = dict(zip(names, args))
    arguments.update(kwargs)
    if not isinstance(arguments.get("input"), Tensor):
        return None
    return FunctionalCall(name, arguments)


class FunctionalRule(Rule):
    """Per-sample gradients of parameters passed to supported functionals (see the module doc)."""

    label = "functional"

    def name(self, module: torch.nn.Module) -> str:  # noqa: D102
        return f"functional rule ({type(module).__name__}'s F.* calls)"

    def broadcast(self, saved: Any, batch_size: int, added: bool) -> Any:  # noqa: D102
        raise ValueError("a functional call whose output was broadcast over the batch")

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """The sum over the calls that used ``owner.<attr>`` of their per-sample gradients."""
        parts: list[PerSampleGrads] = []
        for call, grad in pieces:
            x = batch_first(call.input, batch_size, f"the input of F.{call.name}")
            d = grad * batch_size
            parts.append(_per_sample(call, call.roles[attr], x, d))
        if len(parts) == 1:
            return parts[0]
        return TiedGrads(parts)


def _per_sample(call: FunctionalCall, role: str, x: Tensor, d: Tensor) -> PerSampleGrads:
    a = call.arguments
    if call.name == "linear":
        if role == "weight":
            return OuterProductGrads(x, d)
        return DenseGrads(sum_over_middle(d, keep_last=1))
    if call.name == "embedding":
        rows, padding = a["weight"].shape[0], a.get("padding_idx")
        if padding is not None and padding < 0:
            padding += rows
        return EmbeddingGrads(x, d, rows, padding)
    shape = a["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if role == "weight":
        if call.name == "layer_norm":
            x_hat = F.layer_norm(x, shape, None, None, a.get("eps", 1e-5))
        else:
            x_hat = F.rms_norm(x, shape, None, a.get("eps"))
        d = d * x_hat
    return DenseGrads(sum_over_middle(d, keep_last=len(shape)))
