"""The norm-like quantities take a fixed number of tensor operations, accumulated in float64.

On small models a tracked step's cost is mostly the dispatch of many small tensor
operations (issue 32): ``grad_norm``, ``distance`` and ``update_size`` use one fused
(``torch._foreach_*``) operation for all parameters, so the number of ATen operations they
issue must not grow with the number of parameters.
"""

from __future__ import annotations

import math

import cockpit_basic
import pytest
import torch
from cockpit_basic._norms import norms

from cockpit_core.testing import quantity_operations


@pytest.mark.parametrize("name", ["grad_norm", "distance", "update_size"])
def test_operations_do_not_grow_with_the_number_of_parameters(name):
    few, many = (quantity_operations(name, hidden_layers=n, package=cockpit_basic) for n in (1, 6))
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
