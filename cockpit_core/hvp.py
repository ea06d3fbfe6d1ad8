"""Hessian-vector products of the mini-batch loss: :class:`HessianVectorProducts`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core.errors import MisuseError, UnsupportedModelError


class HessianVectorProducts:
    """Hessian-vector products of the mini-batch loss w.r.t. the tracked parameters.

    The gradient graph is built once per step with ``torch.autograd.grad(create_graph=True)``
    from the retained loss graph, so the user's ``backward`` never needs
    ``create_graph=True`` (which creates a parameter/gradient reference cycle). If the user
    did call ``backward(create_graph=True)``, the differentiable ``p.grad`` are reused and
    detached after the step, which breaks the cycle.

    ``loss`` must be the unscaled loss (not ``scaler.scale(loss)``); ``grad_scale`` is the
    factor the reused ``p.grad`` carry (a ``GradScaler``'s scale), divided out of every
    product computed from them.
    """

    def __init__(self, loss: Tensor | None, params: Sequence[Tensor], grad_scale: float = 1.0):
        self._loss = loss
        self._grad_scale = grad_scale
        self._params = list(params)
        self._grads: tuple[Tensor, ...] | None = None
        self._used_user_graph = False
        self.count = 0

    def _gradient_graph(self) -> tuple[Tensor, ...]:
        if self._grads is not None:
            return self._grads
        user = [p.grad for p in self._params]
        if all(g is not None and g.requires_grad for g in user):
            self._grads = tuple(g for g in user if g is not None)
            self._used_user_graph = True
            return self._grads
        if self._loss is None or not self._loss.requires_grad:
            raise MisuseError(
                "Hessian-vector products need the loss tensor with its graph: pass "
                "info={'loss': loss, ...} to cockpit(step, info=...)."
            )
        try:
            grads = torch.autograd.grad(
                self._loss, self._params, create_graph=True, allow_unused=True
            )
        except RuntimeError as err:
            if "backward through the graph a second time" not in str(err):
                raise
            raise MisuseError(
                "The loss graph was freed by backward() before cockpit could compute "
                "Hessian-vector products. Call loss.backward(retain_graph=cp.retain_graph(step))."
            ) from None
        self._grads = tuple(grads)
        return self._grads

    def __call__(self, vectors: Sequence[Tensor]) -> list[Tensor]:
        """Return ``H v`` (one tensor per parameter) for ``v`` given per parameter."""
        grads = self._gradient_graph()
        used = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        try:
            hv = torch.autograd.grad(
                [grads[i] for i in used],
                self._params,
                grad_outputs=[vectors[i] for i in used],
                retain_graph=True,
                allow_unused=True,
            )
        except RuntimeError as err:  # e.g. fused attention kernels: no double backward
            from cockpit_core.attention import DOUBLE_BACKWARD_HINT, is_missing_double_backward

            if not is_missing_double_backward(err):
                raise
            raise UnsupportedModelError(f"{err}. {DOUBLE_BACKWARD_HINT}") from None
        self.count += 1
        scale = self._grad_scale if self._used_user_graph else 1.0
        return [
            torch.zeros_like(p)
            if h is None
            else (h.detach() if scale == 1.0 else h.detach() / scale)
            for p, h in zip(self._params, hv)
        ]

    def release(self) -> None:
        """Drop the gradient graph; detach user gradients that carry a graph."""
        if self._used_user_graph:
            for p in self._params:
                if p.grad is not None:
                    p.grad = p.grad.detach()
        self._grads = None
        self._loss = None
