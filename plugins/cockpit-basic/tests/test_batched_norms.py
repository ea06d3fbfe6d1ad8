"""The norm-like quantities take a fixed number of tensor operations, accumulated in float64.

On small models a tracked step's cost is mostly the dispatch of many small tensor
operations (issue 32): ``grad_norm``, ``distance`` and ``update_size`` use one fused
(``torch._foreach_*``) operation for all parameters, so the number of ATen operations they
issue must not grow with the number of parameters.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Any

import cockpit_basic
import pytest
import torch
from cockpit_basic._norms import norms
from torch.utils._python_dispatch import TorchDispatchMode

import cockpit_core
from cockpit_core import Cockpit

PLUGIN = str(Path(cockpit_basic.__file__).parent)
CORE = str(Path(cockpit_core.__file__).parent)


class PluginOps(TorchDispatchMode):
    """Counts the ATen operations whose innermost cockpit frame is in this plugin."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        frame = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(PLUGIN):
                self.count += 1
                break
            if filename.startswith(CORE):
                break
            frame = frame.f_back
        return func(*args, **(kwargs or {}))


def plugin_ops(name: str, hidden_layers: int) -> int:
    """Operations ``name`` issues at the second tracked step of a tanh MLP (float64)."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(3, 4), torch.nn.Tanh()]
    for _ in range(hidden_layers):
        layers += [torch.nn.Linear(4, 4), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(4, 2)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [name], on_error="raise")
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,))
    counter = PluginOps()
    for step in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with counter if step == 1 else contextlib.nullcontext():
            with cp(step, info={"loss": loss, "batch_size": 8, "optimizer": opt}):
                loss.backward()
        opt.step()
    assert name in cp.get_output()[0]  # update_size stores its value under its start step
    return counter.count


@pytest.mark.parametrize("name", ["grad_norm", "distance", "update_size"])
def test_operations_do_not_grow_with_the_number_of_parameters(name):
    few, many = plugin_ops(name, hidden_layers=1), plugin_ops(name, hidden_layers=6)
    assert few > 0  # the counter sees the plugin's operations
    assert few == many  # 6 parameters or 16: the same operations


def test_norms_of_float32_tensors_accumulate_in_float64():
    gen = torch.Generator().manual_seed(0)
    tensors = [(torch.randn(shape, generator=gen) + 3).float() for shape in [(100, 1000), (7,)]]
    exact = [math.fsum(v * v for v in t.double().flatten().tolist()) for t in tensors]
    float32_norm = float(torch.linalg.vector_norm(tensors[0])) ** 2
    assert abs(float32_norm - exact[0]) / exact[0] > 1e-9  # float32 accumulation would fail below
    value = norms(tensors)
    expected = [math.sqrt(e) for e in exact]
    assert value["total"] == pytest.approx(math.sqrt(sum(exact)), rel=1e-12)
    assert value["per_param"] == pytest.approx(expected, rel=1e-12)
