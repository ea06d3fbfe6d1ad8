"""Options of the ``autodiff`` provider: per-Cockpit bounds and the MC generator's seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cockpit_autodiff import AutodiffOptions, AutodiffProvider, autodiff_registry
from cockpit_curvature import HessTrace

from cockpit_core import Cockpit
from cockpit_core.errors import ConfigError
from cockpit_core.statistics.provider import ParamSlot
from cockpit_core.testing import tiny_transformer


def _provider(model, options):
    names, params = zip(*model.named_parameters())
    provider = AutodiffProvider(params, names, options)
    provider.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    return provider


def test_cockpit_provider_options_take_precedence_over_the_class_defaults():
    model = tiny_transformer(extended=False).make_model()
    entries = sum(p.numel() for p in model.parameters())
    # the Cockpit's options are shared by every provider: other keys are ignored
    provider = _provider(model, {"max_hvps": entries - 1, "chunk_size": 4, "mc_seed": None})
    assert provider.settings == AutodiffOptions(max_hvps=entries - 1)
    slot = ParamSlot(0, "embed.weight", model.embed.weight, model.embed, "embed", "weight")
    reason = provider.supports(slot, "diag_hessian")
    assert f"{entries:,} per tracked step, above max_hvps={entries - 1:,}" in reason
    assert provider.supports(slot, "diag_ggn_exact") is None  # the bound is the Hessian's
    assert _provider(model, {"max_hvps": entries}).supports(slot, "diag_hessian") is None
    with pytest.raises(ConfigError, match=r"autodiff\.block: Input should be greater than"):
        _provider(model, {"block": 0})


def test_configured_and_the_registry_change_one_cockpit_only():
    with pytest.raises(ConfigError, match=r"autodiff\.max_hvp: Extra inputs"):
        AutodiffProvider.configured(max_hvp=10)  # a typo is an error, not ignored
    bounded = AutodiffProvider.configured(max_hvps=10, block=3, mc_seed=5)
    assert issubclass(bounded, AutodiffProvider) and bounded.name == "autodiff"
    assert (bounded.max_hvps, bounded.block, bounded.mc_seed) == (10, 3, 5)
    assert AutodiffProvider.defaults() == {"max_hvps": 50_000, "block": 256, "mc_seed": 0}
    problem = tiny_transformer(extended=False)
    model = problem.make_model()
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    small = Cockpit(model, [HessTrace()], registry=autodiff_registry(max_hvps=10))
    also_small = Cockpit(model, [HessTrace()], provider_options={"autodiff": {"max_hvps": 10}})
    default = Cockpit(model, [HessTrace()])
    for cp in (small, also_small, default):
        cp.attach(model, loss_fn)
    assert "above max_hvps=10." in str(small.check(model))
    assert "above max_hvps=10." in str(also_small.check(model))
    with pytest.raises(ConfigError, match=r"provider_options\.autodiff\.max_hvp\b"):
        Cockpit(model, [HessTrace()], provider_options={"autodiff": {"max_hvp": 10}})
    assert str(default.check(model)).startswith("hess_trace  ok           autodiff\n")


def _mc_trace(mc_seed: int | None, steps: int = 2) -> tuple[list[float], list[torch.Tensor]]:
    """``hess_trace`` with ``diag_ggn_mc``; the global RNG state before and after each step."""
    problem = tiny_transformer(extended=False)
    model = problem.make_model()
    registry = None if mc_seed is None else autodiff_registry(mc_seed=mc_seed)
    quantities = [HessTrace(method="diag_ggn_mc", mc_samples=2)]
    cp = Cockpit(model, quantities, on_error="raise", registry=registry)
    cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    states = []
    for step in range(steps):
        x, y = problem.batch(step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        states.append(torch.get_rng_state())
        with cp(step, info={"loss": loss, "batch_size": len(x), "inputs": x, "targets": y}):
            loss.backward()
        states.append(torch.get_rng_state())
        model.zero_grad()
    return [cp.get_output()[s]["hess_trace"]["total"] for s in range(steps)], states


def test_mc_ggn_draws_from_its_own_seeded_generator():
    torch.manual_seed(123)
    first, states = _mc_trace(None)
    for before, after in zip(states[::2], states[1::2]):
        assert torch.equal(before, after), "the tracked step changed the global RNG state"
    torch.manual_seed(456)  # another global state: the same draws
    again, _ = _mc_trace(None)
    assert first == again
    other, _ = _mc_trace(7)
    assert not np.allclose(first, other)  # mc_seed selects the draws
    assert all(t > 0 for t in first + other)  # the GGN is positive semi-definite
