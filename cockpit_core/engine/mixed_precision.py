"""Mixed precision: statistics of the unscaled gradients when a ``GradScaler`` scales the loss.

With ``torch.amp.GradScaler`` the training loop backpropagates ``scaler.scale(loss) = S *
loss``, so ``p.grad`` and everything observed during ``backward`` are ``S`` times the
gradients of ``loss``. Given ``info["grad_scaler"]``, the core hands ``S`` to the statistics
providers (they divide what they read during ``backward`` by it) and divides ``p.grad`` by
``S`` where quantities read it (``ctx.grads``, projections), unless ``scaler.unscale_(opt)``
already ran inside the ``with cp(...)`` block. ``docs/mixed_precision.md`` has the loop.

Whether ``unscale_`` ran is read from the scaler's per-optimizer state
(``GradScaler._per_optimizer_states``, a private field of PyTorch's scaler: stage ``READY``
until ``unscale_``/``step``). Where that field cannot be read the gradients are taken as
still scaled, which is right for the documented loop (``unscale_`` after the block).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core.errors import MisuseError


def check_scaler(scaler: Any) -> None:
    """Raise :class:`MisuseError` if ``scaler`` is not usable as ``info["grad_scaler"]``."""
    if not callable(getattr(scaler, "get_scale", None)) or not callable(
        getattr(scaler, "scale", None)
    ):
        raise MisuseError(
            f"info['grad_scaler'] must be the torch.amp.GradScaler that scales the loss, got "
            f"{type(scaler).__name__}. Pass info={{'grad_scaler': scaler, ...}}, or leave the "
            "key out without a scaler."
        )


def enabled(scaler: Any) -> bool:
    """Whether ``scaler`` scales the loss (``GradScaler(enabled=False)`` does not)."""
    is_enabled = getattr(scaler, "is_enabled", None)
    return scaler is not None and (not callable(is_enabled) or bool(is_enabled()))


def loss_scale(scaler: Any) -> float:
    """The factor ``S`` the scaler multiplies the loss by now (1 if it is disabled)."""
    if not enabled(scaler):
        return 1.0
    scale = float(scaler.get_scale())
    return scale if scale > 0.0 else 1.0


def _stages(scaler: Any) -> Mapping[int, Any] | None:
    """The scaler's per-optimizer state (private field), or ``None`` if it is unreadable."""
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, Mapping):
        return None
    for state in states.values():
        if not isinstance(state, Mapping) or "stage" not in state:
            return None
    return states


def _stage_name(state: Mapping[str, Any] | None) -> str:
    if state is None:
        return "READY"
    stage = state.get("stage")
    return str(getattr(stage, "name", stage))


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer inside wrappers (accelerate's ``.optimizer``, Lightning's ``._optimizer``)."""
    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return optimizer


def grads_unscaled(scaler: Any, optimizer: Any) -> bool | None:
    """Whether ``scaler.unscale_`` (or ``step``) already ran for ``optimizer`` since ``update``.

    Without ``optimizer``, whether it ran for any optimizer. ``None``: the scaler's state
    cannot be read (not PyTorch's ``GradScaler``, or its private field changed).
    """
    states = _stages(scaler)
    if states is None:
        return None
    if optimizer is not None:
        return _stage_name(states.get(id(_unwrap(optimizer)))) != "READY"
    return any(_stage_name(s) != "READY" for s in states.values())


def found_inf(scaler: Any, optimizer: Any) -> bool:
    """Whether ``scaler.unscale_`` found inf/NaN in the gradients of ``optimizer`` (or any)."""
    states = _stages(scaler)
    if states is None:
        return False
    if optimizer is not None:
        chosen = [states.get(id(_unwrap(optimizer)))]
    else:
        chosen = list(states.values())
    for state in chosen:
        found = (state or {}).get("found_inf_per_device") or {}
        if any(float(v) > 0 for v in found.values()):
            return True
    return False


class LossGradient:
    """The gradient that reaches ``info["loss"]`` during ``backward``: the loss scale used.

    ``loss.backward()`` sends 1 into the loss, ``scaler.scale(loss).backward()`` sends the
    scaler's scale. A tensor hook records it (one number per step); :meth:`close`
    removes the hook before Hessian-vector products reuse the graph.
    """

    def __init__(self, loss: Any):
        self._grad: Tensor | None = None
        self._handle = None
        if isinstance(loss, Tensor) and loss.requires_grad and loss.numel() == 1:
            self._handle = loss.register_hook(self._record)

    def _record(self, grad: Tensor) -> None:
        # kept as a tensor: reading the number here would wait for the device in backward
        self._grad = grad.detach()

    @property
    def value(self) -> float | None:
        """The gradient that reached the loss (``None``: none went through yet)."""
        return None if self._grad is None else float(self._grad.reshape(-1)[0])

    def close(self) -> float | None:
        """Remove the hook; return the recorded gradient (``None``: none went through)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return self.value


def unscaled(grads: Sequence[Tensor], factor: float) -> list[Tensor]:
    """``grads`` divided by ``factor`` (the same tensors if it is 1)."""
    if factor == 1.0:
        return list(grads)
    return [g / factor for g in grads]


def float_dtype(tensor: Tensor) -> torch.dtype:
    """At least float32: the dtype statistics of ``tensor`` are reduced in."""
    if tensor.dtype in (torch.float16, torch.bfloat16) or not tensor.is_floating_point():
        return torch.float32
    return tensor.dtype
