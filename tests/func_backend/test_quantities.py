"""Every gradient-statistics and curvature quantity on a tiny transformer encoder classifier.

First-order quantities computed from torch.func statistics must equal the same quantities
computed from a per-sample autograd loop (float64; the only difference is summation
order, so 1e-9 relative is tight). Histogram counts must be identical. Curvature
quantities are checked against the explicit Hessian.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_curvature._common import split_like, step_generator
from torch.nn.attention import SDPBackend, sdpa_kernel

from cockpit_core import Cockpit, Quantity, Requirements
from cockpit_core.testing import tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import explicit_hessian, flat
from cockpit_core.testing.transformer import tiny_transformer

from ._helpers import FIRST_ORDER, assert_close, train


def outputs(problem, backend=None, loop=False, **kwargs):
    cp = train(
        problem,
        list(FIRST_ORDER),
        steps=3,
        loop_reference=loop,
        backend=backend or "auto",
        **kwargs,
    )
    out = cp.get_output()
    assert set(out[0]) == set(FIRST_ORDER)
    return out


def test_first_order_quantities_equal_the_per_sample_loop_on_a_transformer():
    problem = tiny_transformer(extended=False)
    assert_close(outputs(problem, "func", chunk_size=4), outputs(problem, loop=True))


def test_mixed_model_gives_the_all_func_values():
    """BackPACK for the extended Linear layers, torch.func elsewhere == torch.func everywhere."""
    mixed = outputs(tiny_transformer(extended=True), "auto")
    assert_close(mixed, outputs(tiny_transformer(extended=False), "func"))


@pytest.mark.parametrize("make", [tiny_mlp, tiny_cnn], ids=["mlp", "cnn"])
def test_backpack_and_func_agree_where_both_work(make):
    assert_close(outputs(make(), "func"), outputs(make(), "backpack"))


SMALL = {"vocab": 5, "seq_len": 3, "d_model": 2, "heads": 1, "ff": 4, "classes": 2}
"""A 76-parameter transformer: its explicit Hessian takes 76 double-backward passes."""


@pytest.fixture(scope="module")
def step0():
    """The transformer problem, its parameters, batch and explicit Hessian at step 0."""
    problem = tiny_transformer(extended=False, **SMALL)
    model = problem.make_model()
    x, y = problem.batch(0)
    with sdpa_kernel(SDPBackend.MATH):  # the fused CPU kernel has no double backward
        hessian = explicit_hessian(model, problem, x, y)
    return problem, [p.detach().clone() for p in model.parameters()], x, y, hessian


def test_hess_max_ev_equals_the_explicit_hessians_largest_eigenvalue(step0):
    problem, params, x, y, hessian = step0
    cp = train(problem, [{"name": "hess_max_ev", "tol": 1e-8}], steps=1)
    assert torch.allclose(hessian, hessian.T, atol=1e-10)
    exact = float(torch.linalg.eigvalsh(hessian)[-1])
    got = cp.get_output()[0]["hess_max_ev"]
    assert got["converged"]
    assert got["value"] == pytest.approx(exact, rel=1e-6)  # Lanczos tol 1e-8 (error bound)


def test_hutchinson_trace_uses_exact_hessian_vector_products(step0):
    """hess_trace(hutchinson) equals the same Rademacher probes applied to the explicit Hessian."""
    problem, params, x, y, hessian = step0
    cp = train(problem, [{"name": "hess_trace", "method": "hutchinson", "probes": 3}], steps=1)
    gen = step_generator(0, 0)
    per_param = torch.zeros(len(params), dtype=torch.float64)
    for _ in range(3):
        v = torch.randint(0, 2, (hessian.shape[0],), generator=gen).double() * 2 - 1
        hv = hessian @ v
        per_param += torch.stack(
            [(a * b).sum() for a, b in zip(split_like(v, params), split_like(hv, params))]
        )
    got = cp.get_output()[0]["hess_trace"]
    np.testing.assert_allclose(got["per_param"], (per_param / 3).numpy(), rtol=1e-9, atol=1e-12)


class HvpProbe(Quantity):
    name = "hvp_probe"
    REQUIREMENTS = Requirements(info={"loss"}, loss_graph=True)

    def compute(self, ctx):
        gen = torch.Generator().manual_seed(3)
        v = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in ctx.params]
        return flat(ctx.hvp(v)).numpy()


def test_hessian_vector_products_without_extend_need_the_math_kernel(step0):
    problem, params, x, y, hessian = step0
    gen = torch.Generator().manual_seed(3)
    v = flat([torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params])
    expected = (hessian @ v).numpy()

    cp = train(problem, [HvpProbe()], steps=1)  # attached: cockpit picks the math kernel
    np.testing.assert_allclose(cp.get_output()[0]["hvp_probe"], expected, rtol=1e-9, atol=1e-12)

    model = problem.make_model()  # not attached: the fused kernel has no double backward
    cp = Cockpit(model.named_parameters(), [HvpProbe()])
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with pytest.warns(UserWarning, match="sdpa_kernel"):
        with cp(0, info={"loss": loss}):
            loss.backward(retain_graph=True)
    assert "UnsupportedModelError" in cp.errors[0]["error"]
    assert "cp.attach(model, loss_fn)" in cp.errors[0]["error"]
