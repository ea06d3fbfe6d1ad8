"""The reference of the real-model tests: per-sample gradients by one autograd call per sample.

Unlike ``tests/providers/loop_provider.py`` it re-runs nothing: it differentiates each of
the step's own per-sample losses (``info["individual_losses"]``, passed with their graph,
and ``backward(retain_graph=True)``), so the reference uses the very forward pass the
user ran (dropout masks, positions broadcast once, tied weights) and needs no knowledge of
how to call the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from cockpit_core import (
    Collection,
    DenseGrads,
    ParamSlot,
    StatisticKind,
    StatisticProvider,
    hookimpl,
)


class AutogradLoopProvider(StatisticProvider):
    """``g_n = grad l_n`` by ``torch.autograd.grad`` of each per-sample loss of the step."""

    name = "autograd_loop"
    cost = 100.0
    description = "one autograd call per sample loss of the step's own graph (test reference)"
    per_sample = True

    def supports(self, slot: ParamSlot, kind: StatisticKind) -> str | None:  # noqa: D102
        return None

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:  # noqa: D102
        losses = collection.info["individual_losses"]
        assert losses.requires_grad, "pass the per-sample losses with their graph"
        yield
        indices = [i for i in sorted(collection.indices) if self.params[i].grad is not None]
        params = [self.params[i] for i in indices]
        rows: list[list[torch.Tensor]] = [[] for _ in indices]
        for loss in losses:
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            for row, p, g in zip(rows, params, grads):
                row.append(torch.zeros_like(p) if g is None else g)
        for i, row in zip(indices, rows):
            collection.deliver(i, DenseGrads(torch.stack(row)))


@hookimpl
def register_statistic_providers(register):  # noqa: D103
    register(AutogradLoopProvider)
