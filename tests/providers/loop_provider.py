"""A statistics provider that loops over samples: one autograd call per sample.

Slow but simple, it works for any model that runs on one sample, and shows the whole
provider protocol: the class says what it delivers, ``supports`` says for which
parameters, ``collect`` hands per-sample gradients to the core, and a hook registers it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from cockpit_core import (
    Collection,
    DenseGrads,
    MissingInfoError,
    ParamSlot,
    StatisticKind,
    StatisticProvider,
    hookimpl,
)


class LoopProvider(StatisticProvider):
    """Per-sample gradients by one autograd call per sample, after the user's ``backward``.

    Needs ``cp.attach(model, loss_fn)`` and the batch in ``info["inputs"]`` and
    ``info["targets"]``.
    """

    name = "loop"  # backend="loop"
    cost = 100.0  # dearer than the built-in providers: backend="auto" picks it last
    description = "one autograd call per sample after backward (slow, any model)"
    per_sample = True  # it delivers per-sample gradients, hence every per-sample kind
    recomputes = True  # it runs its own forward and backward passes after the user's

    def supports(self, slot: ParamSlot, kind: StatisticKind) -> str | None:
        """Every parameter of an attached model, once a per-sample loss is known."""
        if self.model is None or self.loss_fn is None:
            return "needs the model and a per-sample loss: call cp.attach(model, loss_fn)"
        return None

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Let the user's ``backward()`` run, then compute and deliver ``g_n`` per parameter."""
        if "inputs" not in collection.info:  # a usage error: reported before backward runs
            raise MissingInfoError(
                "The 'loop' provider recomputes each sample's loss: pass info={'inputs': x, "
                "'targets': y, ...} to cp(step, info=...)."
            )
        yield  # the user's backward() runs here
        indices = [i for i in sorted(collection.indices) if self.params[i].grad is not None]
        if not indices:
            return
        inputs, targets = collection.info["inputs"], collection.info.get("targets")
        params = [self.params[i] for i in indices]
        rows: list[list[torch.Tensor]] = [[] for _ in indices]
        try:
            with torch.enable_grad():
                for n in range(len(inputs)):
                    out = self.model(inputs[n : n + 1])
                    if targets is None:
                        loss = self.loss_fn(out)
                    else:
                        loss = self.loss_fn(out, targets[n : n + 1])
                    grads = torch.autograd.grad(loss.sum(), params, allow_unused=True)
                    for row, p, g in zip(rows, params, grads):
                        row.append(torch.zeros_like(p) if g is None else g.detach())
        except Exception as err:  # never break the user's training: report, go on
            for stat in collection.statistics:
                collection.fail(stat, f"the 'loop' provider could not run the model: {err}")
            return
        for i, row in zip(indices, rows):
            # the core computes every requested statistic of parameter i from g_n
            collection.deliver(i, DenseGrads(torch.stack(row)))


@hookimpl
def register_statistic_providers(register):
    """Register :class:`LoopProvider`."""
    register(LoopProvider)
