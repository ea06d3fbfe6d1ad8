"""What the core computed for one step, shared by every quantity: :class:`StepData`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from cockpit_core.engine.hvp import HessianVectorProducts
from cockpit_core.engine.micro_batch_norms import MicroBatchNorms
from cockpit_core.engine.mixed_precision import float_dtype
from cockpit_core.observe.probe import ProbeResults

T = TypeVar("T")


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
        probes: ProbeResults | None = None,
        micro_batch_norms: MicroBatchNorms | str | None = None,
    ):
        self.step = step
        self.info = info
        self.params = list(params)
        self.param_names = list(param_names)
        self.statistics = statistics
        self.missing = missing
        self.hvp = hvp
        self.grad_scale = grad_scale
        self.probes = probes if probes is not None else ProbeResults()
        # each micro-batch's own gradient norms, or why there are none (None: not recorded)
        self.micro_batch_norms = micro_batch_norms
        # given under torch.distributed (the global batch's gradient), else read lazily
        self._grads: list[Tensor] | None = None if grads is None else list(grads)
        self._shared: dict[str, Any] = {}

    @property
    def grads(self) -> list[Tensor]:
        """Detached, unscaled gradients (zeros for parameters that received none or are frozen).

        ``p.grad`` divided by :attr:`grad_scale` (a ``GradScaler``'s scale while the
        gradients are still scaled); half-precision gradients are read in float32.
        """
        if self._grads is None:
            self._grads = [_unscaled(p, self.grad_scale) for p in self.params]
        return self._grads

    def shared(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, called once per step for all callers with the same ``key``."""
        if key not in self._shared:
            self._shared[key] = compute()  # if it raises, the next caller computes again
        return self._shared[key]  # type: ignore[no-any-return]

    def release(self) -> None:
        """Free per-step buffers and the Hessian graph."""
        self.statistics = {}
        self._shared = {}
        self._grads = None
        self.info = {}
        self.probes = ProbeResults()
        self.micro_batch_norms = None
        if self.hvp is not None:
            self.hvp.release()


def _unscaled(p: Tensor, scale: float) -> Tensor:
    if p.grad is None or not p.requires_grad:  # a frozen parameter's p.grad is stale
        return torch.zeros_like(p, dtype=float_dtype(p))
    g = p.grad.detach() if p.grad.requires_grad else p.grad  # (create_graph=True)
    if g.dtype != float_dtype(g):
        g = g.to(float_dtype(g))
    return g if scale == 1.0 else g / scale
