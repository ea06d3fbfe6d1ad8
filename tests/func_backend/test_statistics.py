"""torch.func per-sample statistics against a per-sample autograd loop (float64).

Tolerance: both sides compute the same float64 sums in a different order; 1e-10 relative
leaves room for ~1e6 ulps and catches any real error (a wrong sample, scale or parameter).
"""

from __future__ import annotations

import pytest
import torch

from cockpit_core import BATCH_L2
from cockpit_core.testing import tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients
from cockpit_core.testing.transformer import tiny_transformer

from ._helpers import Recorder, _cube_sum, train

RTOL, ATOL = 1e-10, 1e-13


def reference_stats(problem, params, x, y):
    """batch_l2, sum_grad_squared, batch_dot, grad_batch, cube transform per parameter."""
    model = problem.make_model()
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
    grads = per_sample_gradients(model, problem, x, y)
    return {
        "batch_l2": [(g.flatten(1) ** 2).sum(1) for g in grads],
        "sum_grad_squared": [(g**2).sum(0) for g in grads],
        "batch_dot": [g.flatten(1) @ g.flatten(1).T for g in grads],
        "grad_batch": grads,
        "transform": [_cube_sum(g, p) for g, p in zip(grads, model.parameters())],
    }


def run_and_compare(problem, **kwargs):
    """Train two steps with a Recorder, then replay SGD and compare with the loop reference."""
    recorder = Recorder()
    train(problem, [recorder], steps=2, **kwargs)
    model = problem.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = problem.loss_module()
    for step in (0, 1):
        x, y = problem.batch(step)
        params = [p.detach().clone() for p in model.parameters()]
        expected = reference_stats(problem, params, x, y)
        got = recorder.seen[step]
        for kind, values in expected.items():
            for i, (a, e) in enumerate(zip(got[kind], values)):
                torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL, msg=f"{kind}[{i}]")
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("chunk_size", [None, 1, 4])
def test_func_statistics_on_a_tiny_transformer(chunk_size):
    run_and_compare(tiny_transformer(extended=False), backend="func", chunk_size=chunk_size)


def test_backpack_and_func_mix_on_an_extended_transformer():
    problem = tiny_transformer(extended=True)
    backend = ["backpack", "func"]
    cp = train(problem, ["loss"], steps=1, backend=backend)
    routes = {
        name: route.provider
        for name, route in zip(cp.param_names, cp._router.routes(BATCH_L2.kind))
    }
    # BackPACK takes the extended nn.Linear layers, torch.func everything else
    assert routes["head.weight"] == routes["encoder.linear1.weight"] == "backpack"
    assert routes["encoder.self_attn.in_proj_weight"] == "func"
    assert routes["encoder.self_attn.out_proj.weight"] == "func"  # a Linear subclass
    assert routes["encoder.norm1.weight"] == routes["pos"] == routes["embed.weight"] == "func"
    run_and_compare(problem, backend=backend)


def test_auto_routes_every_parameter_to_module_hooks():
    """The learned positions ``pos``, added to the batch in the model's forward, included."""
    problem = tiny_transformer(extended=True)
    cp = train(problem, ["loss"], steps=1, backend="auto")
    routes = {
        name: route.provider
        for name, route in zip(cp.param_names, cp._router.routes(BATCH_L2.kind))
    }
    assert set(routes.values()) == {"hooks"}
    run_and_compare(problem, backend="auto")


@pytest.mark.parametrize("make", [tiny_mlp, tiny_cnn], ids=["mlp", "cnn"])
@pytest.mark.parametrize("backend", ["func", "backpack"])
def test_both_paths_match_the_loop_on_supported_models(make, backend):
    run_and_compare(make(), backend=backend, chunk_size=3)
