"""Shared pieces of the torch.func backend tests: a per-sample-loop reference, a training loop."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cockpit_core import (
    BATCH_DOT,
    BATCH_L2,
    GRAD_BATCH,
    SUM_GRAD_SQUARED,
    Cockpit,
    Quantity,
    Registry,
    Requirements,
    per_sample_transform,
)
from cockpit_core.testing.problems import Problem

FIRST_ORDER = [
    "alpha",
    "cabs",
    "early_stopping",
    "grad_hist_1d",
    "grad_hist_2d",
    "inner_test",
    "mean_gsnr",
    "norm_test",
    "ortho_test",
]


def _cube_sum(grads: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A transform statistic: ``sum_n g_n^3 + theta`` (any function of the per-sample grads)."""
    return (grads**3).sum(0) + param


CUBES = per_sample_transform("cube_sum", _cube_sum)
STATS = (BATCH_L2, SUM_GRAD_SQUARED, BATCH_DOT, GRAD_BATCH, CUBES)


class Recorder(Quantity):
    """Keeps every per-sample statistic it reads (for comparisons with the reference)."""

    name = "recorder"
    REQUIREMENTS = Requirements(statistics=STATS)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seen: dict[int, dict[str, list[torch.Tensor]]] = {}

    def compute(self, ctx):
        self.seen[ctx.step] = {s.kind: [t.detach().clone() for t in ctx.stat(s)] for s in STATS}
        return 0.0


def loop_registry() -> Registry:
    """Every installed plugin plus the third-party test provider ``loop`` (tests/providers)."""
    path = Path(__file__).resolve().parents[1] / "providers" / "loop_provider.py"
    spec = importlib.util.spec_from_file_location("cockpit_test_loop_provider", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry = Registry.from_entry_points()
    info = registry.add_plugin(module, name="loop")
    assert info.ok, info.error
    return registry


def train(
    problem: Problem,
    quantities: list,
    steps: int = 2,
    loop_reference: bool = False,
    attach: bool = True,
    **kwargs: Any,
) -> Cockpit:
    """Train ``problem`` with a Cockpit; ``loop_reference`` computes every statistic with the
    brute-force ``loop`` provider (one autograd call per sample, ``backend="loop"``)."""
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if loop_reference:
        kwargs.update(backend="loop", registry=loop_registry())
    cp = Cockpit(model.named_parameters(), quantities, on_error="raise", **kwargs)
    if attach:
        cp.attach(model, problem.individual_losses)
    for step in range(steps):
        x, y = problem.batch(step)
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
    return cp


def assert_close(actual: Any, expected: Any, rtol: float = 1e-9, atol: float = 1e-12, path=""):
    """Recursive comparison of quantity outputs (dicts, lists, arrays, numbers)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for k in expected:
            assert_close(actual[k], expected[k], rtol, atol, f"{path}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol, atol, f"{path}[{i}]")
    elif isinstance(expected, (np.ndarray, float, int, np.floating, np.integer)):
        a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=path, equal_nan=True)
    elif expected is None or (isinstance(expected, float) and math.isnan(expected)):
        assert actual == expected, path
    else:
        assert actual == expected, path
