"""Hessian-vector products of the mini-batch loss: :class:`HessianVectorProducts`.

``H v`` is the directional derivative of the gradient, ``d/dr grad L(theta + r v)`` at
``r = 0``, so it costs one more backward pass through the graph of the gradient, without
forming ``H`` (Pearlmutter, 1994, "Fast exact multiplication by the Hessian"): build
``g = grad L`` with ``create_graph=True`` once per step, then each product is
``grad(g . v)``.

Gradient checkpointing (``torch.utils.checkpoint.checkpoint``): with
``use_reentrant=False`` the building of ``g`` recomputes the checkpointed parts with
gradients enabled, so the products are exact; the attention hooks run that
recomputation in the kernel of the forward pass (:mod:`cockpit_core.engine.attention`). With
``use_reentrant=True`` PyTorch refuses ``torch.autograd.grad`` through the checkpoint;
the products are then refused with an :class:`~cockpit_core.errors.UnsupportedModelError`
that says so and what to do (the quantity's error is recorded, training goes on).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core.engine.attention import DOUBLE_BACKWARD_HINT, is_missing_double_backward
from cockpit_core.errors import MisuseError, UnsupportedModelError

REENTRANT_CHECKPOINT_HINT = (
    "Hessian-vector products differentiate the gradient graph a second time "
    "(torch.autograd.grad with create_graph=True), but the forward pass ran parts of the "
    "model under torch.utils.checkpoint.checkpoint(..., use_reentrant=True), which "
    "PyTorch cannot differentiate that way, so this quantity is not computed at this step "
    "(the backward pass, the gradients and the first-order quantities are not affected). "
    "Pass use_reentrant=False to torch.utils.checkpoint.checkpoint (what PyTorch "
    "recommends; Hessian quantities then work), or run the steps that track Hessian "
    "quantities without checkpointing."
)


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

    If the gradient graph cannot be built (e.g. through a reentrant
    ``torch.utils.checkpoint``), every later call at this step raises the same error
    without trying again.

    Args:
        loss: The mini-batch loss with its retained graph (``None``: only reused
            differentiable ``p.grad`` can serve).
        params: The parameters ``H`` is taken with respect to.
        grad_scale: What the reused ``p.grad`` are multiplied by.

    Attributes:
        count: Products computed so far.

    """

    def __init__(self, loss: Tensor | None, params: Sequence[Tensor], grad_scale: float = 1.0):
        self._loss = loss
        self._grad_scale = grad_scale
        self._params = list(params)
        self._grads: tuple[Tensor, ...] | None = None
        self._used_user_graph = False
        self._refused: str | None = None  # why the gradient graph cannot be built
        self.count = 0

    def _gradient_graph(self) -> tuple[Tensor, ...]:
        if self._grads is not None:
            return self._grads
        if self._refused is not None:
            raise UnsupportedModelError(self._refused)
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
            if _through_reentrant_checkpoint(err, self._loss):
                self._refused = REENTRANT_CHECKPOINT_HINT
                raise UnsupportedModelError(REENTRANT_CHECKPOINT_HINT) from None
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
        self._refused = None


def _through_reentrant_checkpoint(err: RuntimeError, loss: Tensor) -> bool:
    """Whether ``err`` is PyTorch's refusal of ``autograd.grad`` through a reentrant checkpoint.

    Told by its message, or else by a reentrant checkpoint's node in ``loss``'s graph.
    """
    text = str(err)
    if "use_reentrant=True" in text and "checkpoint" in text:
        return True
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "CheckpointFunctionBackward":
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False
