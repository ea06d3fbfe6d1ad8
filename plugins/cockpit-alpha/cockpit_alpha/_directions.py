"""Predict an optimizer's next update of one parameter from its gradient and state.

``alpha`` needs per-sample directional derivatives ``g_n . u`` at the start of a step,
where ``u`` is the direction of the update the optimizer is about to make. Per-sample
gradients exist only during backpropagation, before ``optimizer.step()``; so, per layer,
the start transform projects them onto a few directions that span the coming update:
the layer's gradient, its parameters and the update predicted here from the optimizer's
state. After the step the real update is fitted in that span; if the fit is exact (up
to rounding), so are the directional derivatives (see :mod:`cockpit_alpha.alpha`).

The formulas follow ``torch.optim`` (2.x) step by step, including weight decay, momentum,
dampening, Nesterov, ``maximize``, AMSGrad, decoupled weight decay (AdamW) and centred
RMSprop, with its fused operations (``lerp``, ``addcmul``), a few per parameter: the core
asks for one parameter at a time. The optimizer's state is read, never written. A wrong
prediction is never silently used: the real update decides.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

GENERIC_EPS = 1e-8
"""Epsilon of the generic direction ``g / (|g| + eps)`` (Adam's default)."""


def _f(value: Any) -> float:
    return float(value.item() if isinstance(value, Tensor) else value)


def _state(state: dict[str, Any], key: str, like: Tensor) -> Tensor:
    """The optimizer's state ``key`` (zeros before its first step); only read, never written."""
    value = state.get(key)
    return torch.zeros_like(like) if value is None else value.to(like)


def sgd_update(group: dict[str, Any], state: dict[str, Any], theta: Tensor, grad: Tensor) -> Tensor:
    """Update of ``torch.optim.SGD``."""
    d = -grad if group.get("maximize", False) else grad
    wd = _f(group.get("weight_decay", 0.0))
    if wd:
        d = d.add(theta, alpha=wd)
    momentum = _f(group.get("momentum", 0.0))
    if momentum:
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = d
        else:
            dampening = _f(group.get("dampening", 0.0))
            buf = buf.to(d).mul(momentum).add_(d, alpha=1 - dampening)
        d = d.add(buf, alpha=momentum) if group.get("nesterov", False) else buf
    return d.mul(-_f(group["lr"]))


def adam_update(
    group: dict[str, Any], state: dict[str, Any], theta: Tensor, grad: Tensor, decoupled: bool
) -> Tensor:
    """Update of ``torch.optim.Adam`` (``decoupled=True``: AdamW)."""
    lr, eps, wd = _f(group["lr"]), _f(group["eps"]), _f(group.get("weight_decay", 0.0))
    beta1, beta2 = (_f(b) for b in group["betas"])
    g = -grad if group.get("maximize", False) else grad
    if wd and not decoupled:
        g = g.add(theta, alpha=wd)
    step = _f(state.get("step", 0.0)) + 1
    m = _state(state, "exp_avg", g).lerp(g, 1 - beta1)
    v = _state(state, "exp_avg_sq", g).mul(beta2).addcmul_(g, g, value=1 - beta2)
    if group.get("amsgrad", False):
        v = torch.maximum(_state(state, "max_exp_avg_sq", g), v)
    denom = v.sqrt_().div_(math.sqrt(1 - beta2**step)).add_(eps)
    step_size = lr / (1 - beta1**step)
    if wd and decoupled:  # the decay, then the step
        return torch.addcdiv(theta.mul(-lr * wd), m, denom, value=-step_size)
    return m.div_(denom).mul_(-step_size)


def rmsprop_update(
    group: dict[str, Any], state: dict[str, Any], theta: Tensor, grad: Tensor
) -> Tensor:
    """Update of ``torch.optim.RMSprop``."""
    lr, alpha, eps = _f(group["lr"]), _f(group["alpha"]), _f(group["eps"])
    g = -grad if group.get("maximize", False) else grad
    wd = _f(group.get("weight_decay", 0.0))
    if wd:
        g = g.add(theta, alpha=wd)
    v = _state(state, "square_avg", g).mul(alpha).addcmul_(g, g, value=1 - alpha)
    if group.get("centered", False):
        mean = _state(state, "grad_avg", g).lerp(g, 1 - alpha)
        v = v.addcmul_(mean, mean, value=-1)
    avg = v.sqrt_().add_(eps)
    momentum = _f(group.get("momentum", 0.0))
    if momentum > 0:
        buf = _state(state, "momentum_buffer", g).mul(momentum).addcdiv_(g, avg)
        return buf.mul_(-lr)
    return g.div(avg).mul_(-lr)


def optimizer_kind(optimizer: Any) -> str:
    """``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"`` or ``"generic"`` (unknown)."""
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adamw" if optimizer.defaults.get("decoupled_weight_decay", False) else "adam"
    if isinstance(optimizer, torch.optim.RMSprop):
        return "rmsprop"
    return "generic"


def generic_direction(grad: Tensor) -> Tensor:
    """``g / (|g| + 1e-8)``: the direction of Adam's first step (no state needed)."""
    return grad / (grad.abs() + GENERIC_EPS)


class UpdatePredictor:
    """Predicts per-parameter updates of one optimizer; parameters are found by storage.

    The per-sample transform receives ``param.detach()``, not the parameter object that
    keys ``optimizer.state``, so parameters are matched by data pointer and shape.
    """

    def __init__(self, optimizer: Any):
        self.kind = optimizer_kind(optimizer)
        self._optimizer = weakref.ref(optimizer)
        self._groups: dict[tuple[int, tuple[int, ...]], tuple[Tensor, dict[str, Any]]] = {}
        if self.kind != "generic":
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self._groups[(p.data_ptr(), tuple(p.shape))] = (p, group)

    def serves(self, optimizer: Any) -> bool:
        """Whether this predictor was built for ``optimizer``."""
        return self._optimizer() is optimizer

    def __call__(self, theta: Tensor, grad: Tensor) -> tuple[Tensor, str]:
        """``(direction, how)``: the predicted update, or the generic direction."""
        found = self._groups.get((theta.data_ptr(), tuple(theta.shape)))
        optimizer = self._optimizer()
        if found is None or optimizer is None:
            return generic_direction(grad), "generic"
        param, group = found
        return self._update(group, optimizer.state.get(param, {}), theta, grad), self.kind

    def stacked(
        self, params: Sequence[Tensor], theta: Tensor, grad: Tensor
    ) -> tuple[Tensor, str] | None:
        """:meth:`__call__` of ``P`` same-shaped ``params`` at once.

        ``theta`` and ``grad`` are their values and gradients stacked, ``[P, *shape]``.

        The formulas are element-wise, so they run once on the stacked parameters and
        optimizer states. ``None`` where that does not hold: parameters of different
        parameter groups, or states that differ in their keys or step counts (the caller
        then predicts one parameter at a time).
        """
        optimizer = self._optimizer()
        found = [self._groups.get((p.data_ptr(), tuple(p.shape))) for p in params]
        if optimizer is None or any(f is None for f in found):
            return (generic_direction(grad), "generic") if self.kind == "generic" else None
        groups = {id(group) for _, group in found}  # type: ignore[misc]  # none is None
        if len(groups) != 1:
            return None
        state = _stack_states([optimizer.state.get(p, {}) for p, _ in found])  # type: ignore[misc]
        if state is None:
            return None
        group = found[0][1]  # type: ignore[index]
        return self._update(group, state, theta, grad), self.kind

    def _update(
        self, group: dict[str, Any], state: dict[str, Any], theta: Tensor, grad: Tensor
    ) -> Tensor:
        with torch.no_grad():  # no graph, even from a differentiable optimizer's state
            if self.kind == "sgd":
                return sgd_update(group, state, theta, grad)
            if self.kind in ("adam", "adamw"):
                decoupled = bool(group.get("decoupled_weight_decay", self.kind == "adamw"))
                return adam_update(group, state, theta, grad, decoupled)
            return rmsprop_update(group, state, theta, grad)


def _stack_states(states: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """One state whose tensors are the parameters' stacked, or ``None`` if they differ.

    Per-parameter tensors (moments, buffers) are stacked; scalars (a step count, stored
    as a number or a 0-d tensor) must be equal in every state.
    """
    keys = set(states[0])
    if any(set(s) != keys for s in states[1:]):
        return None
    out: dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in states]
        first = values[0]
        if all(isinstance(v, Tensor) and v.shape == first.shape for v in values) and first.dim():
            out[key] = torch.stack(values)
        elif all(v is None for v in values):
            out[key] = None
        elif all(_scalar(v) and _f(v) == _f(first) for v in values):
            out[key] = first
        else:
            return None
    return out


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) or (isinstance(value, Tensor) and value.dim() == 0)
