"""What a quantity sees while it computes: :class:`StepContext`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core.cache import FOREVER, Cache
from cockpit_core.errors import MisuseError, UnsupportedModelError
from cockpit_core.mixed_precision import float_dtype
from cockpit_core.requirements import Statistic


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
            self._grads, self._used_user_graph = tuple(user), True
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


class StepData:
    """Everything computed for one step, shared by all quantities (internal to the core)."""

    def __init__(
        self,
        step: int,
        info: Mapping[str, Any],
        params: Sequence[torch.nn.Parameter],
        param_names: Sequence[str],
        statistics: dict[tuple[str, str], list[Tensor | None]],
        missing: dict[tuple[str, str], str],
        hvp: HessianVectorProducts | None,
        grads: Sequence[Tensor] | None = None,
        grad_scale: float = 1.0,
    ):
        self.step = step
        self.info = info
        self.params = list(params)
        self.param_names = list(param_names)
        self.statistics = statistics
        self.missing = missing
        self.hvp = hvp
        self.grad_scale = grad_scale
        # given under torch.distributed (the global batch's gradient), else read lazily
        self._grads: list[Tensor] | None = None if grads is None else list(grads)

    @property
    def grads(self) -> list[Tensor]:
        """Detached, unscaled gradients (zeros for parameters that received none or are frozen).

        ``p.grad`` divided by :attr:`grad_scale` (a ``GradScaler``'s scale while the
        gradients are still scaled); half-precision gradients are read in float32.
        """
        if self._grads is None:
            self._grads = [_unscaled(p, self.grad_scale) for p in self.params]
        return self._grads

    def release(self) -> None:
        """Free per-step buffers and the Hessian graph."""
        self.statistics = {}
        self._grads = None
        self.info = {}
        if self.hvp is not None:
            self.hvp.release()


def _unscaled(p: Tensor, scale: float) -> Tensor:
    if p.grad is None or not p.requires_grad:  # a frozen parameter's p.grad is stale
        return torch.zeros_like(p, dtype=float_dtype(p))
    g = p.grad.detach()
    if g.dtype != float_dtype(g):
        g = g.to(float_dtype(g))
    return g if scale == 1.0 else g / scale


class QuantityCache:
    """The core cache seen by one quantity: keys are private to it."""

    def __init__(self, cache: Cache, owner: str):
        self._cache, self._owner = cache, owner

    def put(self, key: str, value: Any, expires_after: int | None = FOREVER) -> None:
        """Keep ``value`` until step ``expires_after`` has passed (``None``: for the run)."""
        self._cache.put(self._owner, key, value, expires_after)

    def get(self, key: str, default: Any = None) -> Any:
        """Return a kept value or ``default``."""
        return self._cache.get(self._owner, key, default)

    def pop(self, key: str, default: Any = None) -> Any:
        """Remove and return a kept value."""
        return self._cache.pop(self._owner, key, default)


class StepContext:
    """The view of one step that a quantity's ``compute`` receives.

    Attributes:
        step: The step being tracked.
        info: The ``info`` dict the user passed (``loss``, ``batch_size``, ...).
        params: The tracked parameters, in order.
        param_names: Their names (``"0"``, ``"1"``, ... if the Cockpit got bare parameters).
        cache: This quantity's private cross-step cache.

    """

    def __init__(
        self, data: StepData, owner: str, allowed: frozenset[tuple[str, str]], cache: Cache
    ):
        self._data = data
        self._owner = owner
        self._allowed = allowed
        self.step = data.step
        self.info = data.info
        self.params = data.params
        self.param_names = data.param_names
        self.cache = QuantityCache(cache, owner)

    @property
    def grads(self) -> list[Tensor]:
        """The mini-batch gradient of each parameter (``p.grad``, detached, unscaled).

        Unscaled: divided by the scale of ``info["grad_scaler"]`` while ``p.grad`` is
        scaled; half-precision gradients are given in float32.
        """
        return self._data.grads

    @property
    def batch_size(self) -> int:
        """``info["batch_size"]``, or the length of ``info["individual_losses"]``."""
        if "batch_size" in self.info:
            return int(self.info["batch_size"])
        if "individual_losses" in self.info:
            return len(self.info["individual_losses"])
        raise MisuseError(
            f"'{self._owner}' needs the batch size: pass info={{'batch_size': B, ...}}."
        )

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """``info["optimizer"]`` if given."""
        return self.info.get("optimizer")

    def stat(self, statistic: Statistic) -> list[Tensor]:
        """One tensor per parameter of a statistic declared in ``requirements()``.

        Raises:
            KeyError: The quantity did not declare this statistic.
            UnsupportedModelError: It could not be computed for some parameters.

        """
        ident = statistic.identity
        if ident not in self._allowed:
            raise KeyError(
                f"'{self._owner}' reads statistic {statistic.describe()} that its requirements() "
                "do not declare; add it to Requirements(statistics=...)."
            )
        if ident in self._data.missing:
            raise UnsupportedModelError(self._data.missing[ident])
        return self._data.statistics[ident]  # type: ignore[return-value]

    def hvp(self, vectors: Sequence[Tensor]) -> list[Tensor]:
        """Hessian-vector product of the mini-batch loss, one tensor per parameter.

        Requires ``Requirements(loss_graph=True)`` and ``info["loss"]``.
        """
        if self._data.hvp is None:
            raise KeyError(
                f"'{self._owner}' calls ctx.hvp but its requirements() do not set loss_graph=True."
            )
        return self._data.hvp(vectors)

    @property
    def hvp_count(self) -> int:
        """Number of Hessian-vector products computed so far at this step (all quantities)."""
        return 0 if self._data.hvp is None else self._data.hvp.count
