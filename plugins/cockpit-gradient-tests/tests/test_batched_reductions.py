"""The reductions take a fixed number of tensor operations for the whole model, in float64.

On small models a tracked step's cost is mostly the dispatch of many small tensor
operations (issue 32), so the quantities batch their reductions over parameters: the number
of ATen operations they issue must not grow with the number of parameters. The helpers must
still accumulate in float64 when the statistics and gradients are float32.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import cockpit_gradient_tests
import pytest
import torch
from cockpit_gradient_tests._common import ShapeGroups, per_sample64, squared_norms

from cockpit_core import BATCH_L2, MisuseError
from cockpit_core.testing import quantity_operations

NAMES = ["norm_test", "inner_test", "ortho_test", "mean_gsnr", "early_stopping", "cabs"]


@pytest.mark.parametrize("name", NAMES)
def test_operations_do_not_grow_with_the_number_of_parameters(name):
    few, many = (
        quantity_operations(name, hidden_layers=n, package=cockpit_gradient_tests) for n in (1, 6)
    )
    assert few > 0  # the counter sees the plugin's operations
    assert few == many  # 6 parameters or 16: the same operations, on stacked tensors


def test_squared_norms_accumulate_in_float64():
    gen = torch.Generator().manual_seed(0)
    tensors = [(torch.randn(shape, generator=gen) + 3).float() for shape in [(100, 1000), (7,), ()]]
    exact = [math.fsum(v * v for v in t.double().flatten().tolist()) for t in tensors]
    float32_sum = float(tensors[0].pow(2).sum())
    assert abs(float32_sum - exact[0]) / exact[0] > 1e-9  # float32 accumulation would fail below
    values = squared_norms(tensors)
    assert values.dtype == torch.float64
    torch.testing.assert_close(values, torch.tensor(exact, dtype=torch.float64), rtol=1e-12, atol=0)


def test_shape_groups_sum_each_parameter_in_parameter_order():
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 2), (2,), (), (3, 2), (2,), (4, 1, 2), (), (0,)]
    tensors = [torch.randn(shape, generator=gen).float() for shape in shapes]
    groups = ShapeGroups(tensors)
    assert groups.indices == [[0, 3], [1, 4], [2, 6], [5], [7]]
    assert groups.numel == [6, 2, 1, 6, 2, 8, 1, 0]
    stacks = groups.stack64(tensors)
    assert all(s.dtype == torch.float64 for s in stacks)
    expected = torch.stack([t.double().sum() for t in tensors])
    torch.testing.assert_close(groups.sums(stacks), expected, rtol=1e-15, atol=1e-15)


def _context(values: list[torch.Tensor | None], batch_size: int = 5) -> Any:
    grads = [torch.zeros(2, dtype=torch.float32)]
    return SimpleNamespace(
        stat=lambda statistic: values,
        batch_size=batch_size,
        grads=grads,
        shared=lambda key, compute: compute(),
    )


def test_per_sample_statistics_are_stacked_in_float64_with_zeros_where_missing():
    a, b = torch.rand(4), torch.rand(4)
    out = per_sample64(_context([a, None, b]), BATCH_L2, "norm_test")
    assert out.dtype == torch.float64 and out.shape == (3, 4)
    torch.testing.assert_close(out, torch.stack([a.double(), torch.zeros(4).double(), b.double()]))
    # no parameter has the statistic: the batch size comes from info
    assert per_sample64(_context([None, None]), BATCH_L2, "norm_test").shape == (2, 5)


def test_per_sample_statistics_of_one_sample_raise():
    with pytest.raises(MisuseError, match="'norm_test' needs at least 2 samples"):
        per_sample64(_context([torch.rand(1)]), BATCH_L2, "norm_test")
