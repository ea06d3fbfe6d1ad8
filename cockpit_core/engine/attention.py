"""Attention that can be differentiated twice: the math kernel of ``scaled_dot_product_attention``.

Hessian-vector products are computed by double backward through the graph of the user's
forward pass (Pearlmutter, 1994, "Fast exact multiplication by the Hessian"). PyTorch's
fused attention kernels (flash attention on CPU, flash/memory-efficient on GPU) have no
double backward, and no ``vmap`` batching rule, so the kernel has to be chosen *before*
the forward pass runs. :class:`MathAttentionHooks` does that for an attached model with a
forward pre-hook that enters ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` and a
forward hook that leaves it (also when the forward raises).

Gradient checkpointing (``torch.utils.checkpoint``) runs parts of the forward pass again
during ``backward``, outside the model's forward hooks. That recomputation must use the
kernel the forward pass used: the non-reentrant variant compares the tensors it saves
with the recomputed ones and raises ``CheckpointError`` when their shapes differ (the math
kernel saves other tensors than the fused one). :class:`MathAttentionHooks` therefore
holds the math kernel during every backward pass through a forward pass it switched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch

DOUBLE_BACKWARD_HINT = (
    "The forward pass used a fused attention kernel, which has no double backward, so "
    "Hessian-vector products cannot be computed. Call cp.attach(model, loss_fn) (cockpit "
    "then runs attention in the math kernel while a quantity needs Hessian-vector "
    "products), or run the forward pass under "
    "`with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):`."
)


def math_attention() -> contextlib.AbstractContextManager[None]:
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

    A forward pass that ran in the math kernel gets its kernel back during its backward
    passes: a pre-hook on the autograd node of each output enters the math kernel when a
    backward pass reaches the model (the user's ``backward``, each
    ``torch.autograd.grad`` of the Hessian-vector products), and a callback queued on that
    backward pass leaves it when the pass ends. So ``torch.utils.checkpoint`` recomputes
    attention in the kernel the forward pass used, whether or not the backward pass runs
    inside a ``with cp(step, ...)`` block. A kernel still held after a backward pass that
    raised is left at the next forward pass (not run from inside a backward pass), by
    :meth:`release` or on :meth:`remove`.

    Inside a region compiled by ``torch.compile`` the hooks do nothing: cockpit runs
    compiled code eagerly while a step needs Hessian-vector products
    (:mod:`cockpit_core.engine.compiled`), so the compiled graph of the other steps keeps the
    fused kernel and no hook of cockpit's.

    Args:
        model: The module whose forward passes are affected.
        active: Called before each forward pass; the math kernel is used only when it
            returns ``True`` (and gradients are enabled).

    """

    def __init__(self, model: torch.nn.Module, active: Callable[[], bool]):
        self._active = active
        # per forward pass running now: the kernel it entered (None: it kept the fused one)
        self._stack: list[contextlib.AbstractContextManager[None] | None] = []
        # kernels entered by backward passes that are running
        self._held: list[contextlib.AbstractContextManager[None]] = []
        self._handles = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._leave, always_call=True),
        ]

    def _enter(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        if torch.compiler.is_compiling():  # traced by torch.compile: tracked steps run eager
            return
        if not self._stack and not _in_backward():  # kernels of failed backward passes
            self.release()
        ctx = None
        if torch.is_grad_enabled() and self._active():
            ctx = math_attention()
            ctx.__enter__()
        self._stack.append(ctx)

    def _leave(self, module: torch.nn.Module, args: tuple[object, ...], output: object) -> None:
        if torch.compiler.is_compiling():
            return
        if self._stack:
            ctx = self._stack.pop()
            if ctx is not None:
                ctx.__exit__(None, None, None)
                if not self._stack:
                    self._bind_backward(output)

    def _bind_backward(self, output: object) -> None:
        """Hold the math kernel in every backward pass through the outputs' autograd nodes."""
        nodes = {}
        for tensor in _tensors(output):
            if tensor.grad_fn is not None:
                nodes[id(tensor.grad_fn)] = tensor.grad_fn
        for node in nodes.values():
            try:
                node.register_prehook(self._backward_reached)
            except RuntimeError:  # pragma: no cover - e.g. inside a torch.func transform
                continue

    def _backward_reached(self, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        ctx = math_attention()
        ctx.__enter__()
        self._held.append(ctx)
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        except RuntimeError:  # pragma: no cover - not inside a backward pass
            self.release()

    def _backward_done(self) -> None:
        if self._held:
            self._held.pop().__exit__(None, None, None)

    def release(self) -> None:
        """Leave kernels still held by backward passes that raised (last entered first)."""
        while self._held:
            self._held.pop().__exit__(None, None, None)

    def remove(self) -> None:
        """Remove the hooks (and leave any kernel a backward pass still holds)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.release()


def _tensors(output: object) -> Iterator[torch.Tensor]:
    """The tensors in a forward pass's output (nested tuples, lists, dicts, model outputs)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, Mapping):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (list, tuple)):
        for value in output:
            yield from _tensors(value)


def _in_backward() -> bool:
    """Whether this thread is running a backward pass now."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1
