"""A third-party provider written against docs/providers.md: registered, routed, conformant."""

from __future__ import annotations

import types

import pytest
import torch

from cockpit_core import (
    BATCH_L2,
    BATCH_PROJECTION,
    SUM_GRAD_SQUARED,
    Cockpit,
    MissingInfoError,
    hookimpl,
)
from cockpit_core.testing import check_provider, tiny_mlp
from cockpit_core.testing.transformer import tiny_transformer

from ._common import Recorder, assert_close, registry_with, train
from .loop_provider import LoopProvider

STATS = [BATCH_L2, SUM_GRAD_SQUARED, BATCH_PROJECTION]


def test_listed_with_its_distribution():
    registry = registry_with()
    (info,) = [p for p in registry.plugins if p.providers == ["loop"]]
    assert info.ok and info.module.endswith("loop_provider")
    assert registry.providers["loop"].cls is LoopProvider


def test_backend_loop_routes_every_parameter_to_it():
    problem = tiny_transformer(extended=False)
    recorder = Recorder(STATS)
    cp, model, _ = train(problem, [recorder], registry_with(), steps=1, backend="loop")
    report = cp.check(model)
    assert report.ok
    assert {provider for route in report.params for _, provider in route.providers} == {"loop"}
    assert all(len(v) == 16 for v in recorder.seen[0].values())


class CheapLoop(LoopProvider):
    """The loop provider, cheaper than every other: ``backend="auto"`` prefers it."""

    name = "cheap_loop"
    cost = 0.01
    collected: list[int] = []

    def collect(self, collection):  # noqa: D102
        CheapLoop.collected.append(len(collection.indices))
        return super().collect(collection)


@hookimpl
def _register_cheap(register):
    register(CheapLoop)


def test_auto_prefers_the_cheapest_provider():
    cheap = types.SimpleNamespace(register_statistic_providers=_register_cheap)
    registry = registry_with(cheap)
    assert min(e.cls.cost for n, e in registry.providers.items() if n != "cheap_loop") > 0.01
    problem = tiny_mlp()
    CheapLoop.collected.clear()
    cp, model, _ = train(problem, [Recorder(STATS)], registry, steps=2, backend="auto")
    served = {provider for route in cp.check(model).params for _, provider in route.providers}
    assert served == {"cheap_loop"}
    assert CheapLoop.collected == [6, 6]  # it served all 6 parameters at both steps


def test_passes_the_conformance_kit():
    report = check_provider(LoopProvider)
    for problem in ("mlp", "cnn", "transformer"):
        assert not any(report.unsupported[problem].values()), report.unsupported[problem]
        assert set(report.checked[problem]) >= {"batch_l2", "batch_dot", "per_sample_projection"}


QUANTITIES = ["norm_test", "inner_test", "ortho_test", "mean_gsnr", "cabs", "early_stopping"]


def test_quantities_through_it_equal_those_through_func():
    registry = registry_with()
    problem = tiny_transformer(extended=False)
    outputs = {
        backend: train(problem, list(QUANTITIES), registry, steps=3, backend=backend)[0]
        for backend in ("loop", "func")
    }
    loop, func = (outputs[b].get_output() for b in ("loop", "func"))
    assert set(loop[0]) == set(QUANTITIES)
    assert_close(loop, func, rtol=1e-10)
    assert not outputs["loop"].errors


def test_without_inputs_it_says_what_to_pass():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(
        model.named_parameters(), [Recorder([BATCH_L2])], registry=registry_with(), backend="loop"
    )
    cp.attach(model, problem.individual_losses)
    x, y = problem.batch(0)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with pytest.raises(MissingInfoError, match="info=\\{'inputs'"):
        with cp(0, info={"loss": loss, "batch_size": len(x)}):
            loss.backward()


def test_gradient_accumulation_needs_no_code_in_the_provider():
    """Two micro-batches of 4 through the loop provider give the statistics of the batch of 8."""
    problem = tiny_mlp(batch_size=8)
    registry = registry_with()
    whole = Recorder(STATS)
    train(problem, [whole], registry, steps=1, backend="loop")

    model = problem.make_model()
    loss_fn = problem.loss_module()
    parts = Recorder(STATS)
    cp = Cockpit(model.named_parameters(), [parts], registry=registry, backend="loop")
    cp.attach(model, problem.individual_losses)
    x, y = problem.batch(0)
    with cp(0, info={"batch_size": len(x)}, accumulate=True) as run:
        for xs, ys in ((x[:4], y[:4]), (x[4:], y[4:])):
            out = model(xs)
            loss = loss_fn(out, ys) * (len(xs) / len(x))
            info = {
                "loss": loss,
                "individual_losses": problem.individual_losses(out, ys).detach(),
                "batch_size": len(xs),
                "inputs": xs,
                "targets": ys,
            }
            with run.micro_batch(info):
                loss.backward()
    assert not cp.errors
    for stat in STATS:
        for a, b in zip(
            parts.seen[0][stat.describe()], whole.seen[0][stat.describe()], strict=True
        ):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
