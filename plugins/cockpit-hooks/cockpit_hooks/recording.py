"""What the module-hook provider records between a forward pass and its tracked backward.

A *site* is one use of some parameters in the forward pass (a module call, or one
projection inside attention): what its rule kept (usually the layer input), and, once the
backward pass reached it, the gradient of its output. Sites are referenced *weakly* until
their gradient arrives: the only strong reference is the hook on the output tensor, which
lives as long as that part of the autograd graph. A forward pass whose backward never
comes (an evaluation with gradients enabled, a dropped graph) therefore frees what it
recorded with its graph, and nothing piles up while the provider is armed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from cockpit_hooks.rules import Rule


@dataclass(eq=False)
class Site:
    """One recorded use: the parameters it feeds, what was kept, the output gradient.

    Attributes:
        rule: The rule of the module.
        module: The module whose call (or whose functional call) this use is.
        params: ``(tracked index, owner module, attribute)`` of each parameter it feeds.
        saved: What the rule kept from the forward pass.
        shape: The shape of the use's output.
        grad: The gradient of the use's output (set during ``backward``).
        handle: The hook on the output tensor.
        per_sample: When the output was broadcast over the batch
            (:mod:`cockpit_hooks.broadcast`): the per-sample gradients of the loss w.r.t.
            it, ``[B, *shape]``, summed over its broadcasts; ``grad`` is then the total.

    """

    rule: Rule
    module: torch.nn.Module
    params: list[tuple[int, torch.nn.Module, str]]
    saved: Any
    shape: torch.Size
    grad: Tensor | None = None
    handle: Any = None
    per_sample: Tensor | None = None

    @property
    def broadcast(self) -> bool:
        """Whether the output was broadcast over the batch (per-sample gradients captured)."""
        return self.per_sample is not None

    @property
    def complete(self) -> bool:
        """Whether the backward pass reached the use."""
        return self.grad is not None or self.per_sample is not None

    def release(self) -> None:
        """Remove the output hook and drop the tensors."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        self.saved = self.grad = self.per_sample = None


@dataclass
class State:
    """Uses recorded since the provider was armed, until the tracked backward ends.

    Attributes:
        sites: Every recorded site (weakly).
        by_param: The sites of each parameter index (weakly).
        live: Sites that received their output gradient (kept until the step ends).
        done: Parameters whose per-sample gradients were handed over (or failed).
        failed: Why a rule could not record a use of a parameter in the forward pass.

    """

    sites: list[weakref.ref[Site]] = field(default_factory=list)
    by_param: dict[int, list[weakref.ref[Site]]] = field(default_factory=dict)
    live: list[Site] = field(default_factory=list)
    done: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)

    def add(self, site: Site) -> None:
        """Record ``site`` (weakly) for each of its parameters."""
        ref = weakref.ref(site)
        self.sites.append(ref)
        for i, _, _ in site.params:
            self.by_param.setdefault(i, []).append(ref)

    def sites_of(self, i: int) -> list[Site]:
        """The sites of parameter ``i`` that are still alive."""
        return [s for s in (r() for r in self.by_param.get(i, ())) if s is not None]

    def forget(self, site: Site) -> None:
        """Drop ``site`` (its output's gradient came in an untracked backward)."""
        site.release()
        self.sites = [r for r in self.sites if r() is not None and r() is not site]
        for i, _, _ in site.params:
            refs = self.by_param.get(i)
            if refs is not None:
                refs[:] = [r for r in refs if r() is not None and r() is not site]

    def clear(self) -> None:
        """Release every site."""
        for ref in self.sites:
            site = ref()
            if site is not None:
                site.release()
        self.sites, self.by_param, self.live = [], {}, []
        self.done, self.failed = set(), {}


def hook_target(output: Tensor) -> Tensor:
    """The tensor whose gradient is the output's: the output, or the base it views.

    ``F.linear`` on ``[B, T, in]`` returns a view of a ``[B T, out]`` product. A hook on
    the view is lost when the view is changed in place afterwards (``ReLU(inplace=True)``
    replaces its autograd node); a hook on the base survives and receives the gradient of
    the value before the change, which is the layer's output gradient. Only a base of the
    same size and contiguous layout is used, so its gradient is the output's, reshaped.
    """
    base = output._base
    if (
        base is not None
        and base.requires_grad
        and base.numel() == output.numel()
        and base.is_contiguous()
        and output.is_contiguous()
    ):
        return base
    return output


class Intercept(TorchFunctionMode):
    """Hands one functional (e.g. ``F.multi_head_attention_forward``) to a handler.

    Inside ``__torch_function__`` the mode is not active, so the handler's own torch
    calls run normally.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        handler: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
    ):
        super().__init__()
        self.func, self.handler = func, handler

    def __torch_function__(  # noqa: D105
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is self.func:
            return self.handler(func, args, kwargs)
        return func(*args, **kwargs)


_SEQUENCE_FIRST_LAYERS = (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)


def sequence_first_modules(model: torch.nn.Module) -> dict[torch.nn.Module, str]:
    """Modules inside a ``batch_first=False`` transformer layer, with why hooks cannot serve them.

    Such a layer hands its feed-forward ``nn.Linear`` and ``nn.LayerNorm`` modules ``[T,
    B, d]`` inputs; their rules need the batch on dimension 0 (and could not tell the
    layouts apart when ``T == B``). Its attention modules are fine: their rule reads
    ``batch_first``.
    """
    out: dict[torch.nn.Module, str] = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, _SEQUENCE_FIRST_LAYERS) or layer.self_attn.batch_first:
            continue
        attention = [m for m in layer.modules() if isinstance(m, torch.nn.MultiheadAttention)]
        skip = {id(m) for a in attention for m in a.modules()}
        reason = (
            f"inside '{name or type(layer).__name__}' ({type(layer).__name__}) with "
            "batch_first=False its input is [T, B, ...] (sequence first), but module hooks "
            "need the batch on dimension 0: build the layer with batch_first=True"
        )
        for sub in layer.modules():
            if sub is not layer and id(sub) not in skip:
                out.setdefault(sub, reason)
    return out


def gradient_mismatch(predicted: Tensor, total: Tensor) -> float:
    """``||predicted - total|| / ||total||`` (0 when both vanish, inf when only ``total`` does)."""
    diff = float((predicted.to(total.dtype) - total).norm())
    scale = float(total.norm())
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def mismatch_tolerance(dtype: torch.dtype) -> float:
    """Accepted :func:`gradient_mismatch` of a complete set of uses in ``dtype``.

    Rounding of float32 sums over a batch stays far below 1e-3; a use the hooks did not
    see changes the gradient by a fraction of its own size, usually O(1).
    """
    if dtype == torch.float64:
        return 1e-8
    if dtype == torch.float32:
        return 1e-3
    return 3e-2
