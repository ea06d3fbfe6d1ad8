"""Attention that can be differentiated twice: the math kernel of ``scaled_dot_product_attention``.

Hessian-vector products are computed by double backward through the graph of the user's
forward pass (Pearlmutter, 1994, "Fast exact multiplication by the Hessian"). PyTorch's
fused attention kernels (flash attention on CPU, flash/memory-efficient on GPU) have no
double backward, and no ``vmap`` batching rule, so the kernel has to be chosen *before*
the forward pass runs. :class:`MathAttentionHooks` does that for an attached model with a
forward pre-hook that enters ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` and a
forward hook that leaves it (also when the forward raises).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

DOUBLE_BACKWARD_HINT = (
    "The forward pass used a fused attention kernel, which has no double backward, so "
    "Hessian-vector products cannot be computed. Call cp.attach(model, loss_fn) (cockpit "
    "then runs attention in the math kernel while a quantity needs Hessian-vector "
    "products), or run the forward pass under "
    "`with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):`."
)


def math_attention() -> contextlib.AbstractContextManager:
    """Run ``scaled_dot_product_attention`` in its math kernel (batched by vmap, twice differentiable).

    The fused CPU kernel has no vmap batching rule (a slow per-sample fallback) and no
    double backward.
    """
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


def is_missing_double_backward(err: BaseException) -> bool:
    """Whether ``err`` says that some operation of the graph has no double backward."""
    text = str(err)
    return "derivative for" in text and "not implemented" in text


class MathAttentionHooks:
    """Forward hooks on ``model`` that run its attention in the math kernel.

    Args:
        model: The module whose forward passes are affected.
        active: Called before each forward pass; the math kernel is used only when it
            returns ``True`` (and gradients are enabled).

    """

    def __init__(self, model: torch.nn.Module, active: Callable[[], bool]):
        self._active = active
        self._stack: list = []
        self._handles = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._leave, always_call=True),
        ]

    def _enter(self, module: torch.nn.Module, args: tuple) -> None:
        ctx = None
        if torch.is_grad_enabled() and self._active():
            ctx = math_attention()
            ctx.__enter__()
        self._stack.append(ctx)

    def _leave(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        if self._stack:
            ctx = self._stack.pop()
            if ctx is not None:
                ctx.__exit__(None, None, None)

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
