"""Catching the functional losses called on the model's output (a ``TorchFunctionMode``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from cockpit_core.engine.losses import CAUGHT_FUNCTIONALS
from cockpit_core.observe.forward_pass import ForwardPass, LossCall


class LossCatcher(TorchFunctionMode):
    """Records calls of the functional losses whose input is the model's output or a view of it.

    Args:
        seen: The forward pass whose output is watched (its ``caught`` list grows).

    """

    def __init__(self, seen: ForwardPass):
        super().__init__()
        self.seen = seen
        self.base = base_of(seen.scores) if seen.scores is not None else None

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``func``; record it if it is a loss on the watched output."""
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in CAUGHT_FUNCTIONALS and torch.is_grad_enabled():
            first = args[0] if args else kwargs.get("input")
            if isinstance(first, Tensor) and self.base is not None and base_of(first) is self.base:
                self.seen.caught.append(LossCall(func, tuple(args), dict(kwargs), result))
        return result


def base_of(tensor: Tensor) -> Tensor:
    """The tensor whose storage ``tensor`` views (``tensor`` itself if it is no view)."""
    base = tensor._base
    return tensor if base is None else base


def push_under(mode: TorchFunctionMode) -> None:
    """Put ``mode`` at the bottom of the torch-function mode stack.

    Modes entered later are above it; those active now (entered in forward hooks that
    leave theirs when they run next) stay above it too, so they leave their own mode.
    """
    above = []
    while torch._C._len_torch_function_stack() > 0:
        above.append(torch._C._pop_torch_function_stack())
    torch._C._push_on_torch_function_stack(mode)
    for other in reversed(above):
        torch._C._push_on_torch_function_stack(other)


def remove_mode(mode: TorchFunctionMode) -> None:
    """Take ``mode`` off the torch-function mode stack, wherever it is; keep the others."""
    above = []
    while torch._C._len_torch_function_stack() > 0:
        top = torch._C._pop_torch_function_stack()
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        torch._C._push_on_torch_function_stack(other)
