"""Shared pieces of the provider tests: registries with the test plugins, a training loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cockpit_core import Cockpit, Quantity, Registry, Requirements, Statistic
from cockpit_core.testing import Problem

from . import l1_kind, loop_provider


def registry_with(*plugins: Any) -> Registry:
    """Every installed plugin, plus the test ``loop`` provider and ``batch_l1`` kind plugins."""
    registry = Registry.from_entry_points()
    for plugin in (loop_provider, l1_kind, *plugins):
        info = registry.add_plugin(plugin, name=getattr(plugin, "__name__", repr(plugin)))
        assert info.ok, info.error
    return registry


class Recorder(Quantity):
    """Keeps the values of the statistics it is given, one list of tensors per step."""

    name = "recorder"

    def __init__(self, stats: Sequence[Statistic], **kwargs: Any):
        super().__init__(**kwargs)
        self.stats = tuple(stats)
        self.seen: dict[int, dict[str, list[torch.Tensor]]] = {}

    def requirements(self) -> Requirements:  # noqa: D102
        return Requirements(statistics=self.stats)

    def compute(self, ctx):  # noqa: D102
        self.seen[ctx.step] = {
            s.describe(): [t.detach().clone() for t in ctx.stat(s)] for s in self.stats
        }


def train(
    problem: Problem,
    quantities: list,
    registry: Registry,
    steps: int = 2,
    **kwargs: Any,
) -> tuple[Cockpit, torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor, dict]]]:
    """Train ``problem`` with an attached Cockpit; returns it, the model and each step's batch.

    The third item holds, per step, ``(x, y, params)`` with the parameter values the step
    started from (for brute-force references).
    """
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(
        model.named_parameters(), quantities, registry=registry, on_error="raise", **kwargs
    )
    cp.attach(model, problem.individual_losses)
    batches = []
    for step in range(steps):
        x, y = problem.batch(step)
        batches.append((x, y, {n: p.detach().clone() for n, p in model.named_parameters()}))
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        info = {
            "loss": loss,
            "individual_losses": problem.individual_losses(out, y).detach(),
            "batch_size": len(x),
            "optimizer": opt,
            "inputs": x,
            "targets": y,
        }
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp, model, batches


def model_with(problem: Problem, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A fresh model of ``problem`` holding ``params``."""
    model = problem.make_model()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
    return model


def assert_close(actual: Any, expected: Any, rtol: float = 1e-10, path: str = "") -> None:
    """Recursive comparison of quantity outputs (dicts, lists, arrays, numbers)."""
    import numpy as np

    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for k in expected:
            assert_close(actual[k], expected[k], rtol, f"{path}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol, f"{path}[{i}]")
    elif expected is None or isinstance(expected, (str, bool)):
        assert actual == expected, path
    else:
        a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-14, err_msg=path, equal_nan=True)
