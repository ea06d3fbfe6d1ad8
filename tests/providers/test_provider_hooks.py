"""The two statistics hooks: ``register_statistic_providers`` and ``register_statistic_kinds``."""

from __future__ import annotations

import types

import pytest
import torch

from cockpit_core import Registry, Statistic, StatisticKind, StatisticProvider, hookimpl
from cockpit_core.statistics.kinds import BATCH_L2_KIND
from cockpit_core.testing import tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients

from . import l1_kind, loop_provider
from ._common import Recorder, model_with, registry_with, train
from .l1_kind import BATCH_L1
from .loop_provider import LoopProvider


def plugin(**hooks) -> types.SimpleNamespace:
    """A plugin object with the given hook implementations."""
    return types.SimpleNamespace(**{name: hookimpl(fn) for name, fn in hooks.items()})


def test_hook_register_statistic_providers():
    registry = Registry()
    info = registry.add_plugin(loop_provider, name="loop", distribution="cockpit-loop")
    assert info.ok, info.error
    assert info.providers == ["loop"]  # what `cockpit plugins` shows per plugin
    assert registry.providers["loop"].cls is LoopProvider
    assert registry.providers["loop"].distribution == "cockpit-loop"
    assert registry.providers["func"].distribution == "cockpit-core"  # the core's own plugin


def test_an_invalid_provider_skips_the_plugin_with_the_reason():
    class BadName(LoopProvider):
        name = "Loop-Provider"

    registry = Registry()
    info = registry.add_plugin(
        plugin(register_statistic_providers=lambda register: register(BadName))
    )
    assert not info.ok and "snake_case" in info.error
    info = registry.add_plugin(
        plugin(register_statistic_providers=lambda register: register(object)), name="other"
    )
    assert not info.ok and "StatisticProvider" in info.error
    assert set(registry.providers) == {"func"}


def test_a_provider_name_registered_twice_is_reported_naming_both_distributions():
    class AnotherFunc(StatisticProvider):
        name = "func"
        description = "an impostor"
        per_sample = True

    registry = Registry()
    info = registry.add_plugin(
        plugin(register_statistic_providers=lambda register: register(AnotherFunc)),
        name="impostor",
        distribution="cockpit-impostor",
    )
    assert info.ok and info.providers == []
    assert registry.providers["func"].cls is not AnotherFunc
    message = str(registry.conflicts["provider:func"])
    assert "cockpit-core" in message and "cockpit-impostor" in message


def _l1_reference(problem, batches, step):
    x, y, params = batches[step]
    grads = per_sample_gradients(model_with(problem, params), problem, x, y)
    return [g.flatten(1).abs().sum(1) for g in grads]


def test_hook_register_statistic_kinds():
    registry = Registry()
    info = registry.add_plugin(l1_kind, name="l1", distribution="cockpit-l1")
    assert info.ok, info.error
    assert registry.kinds["batch_l1"] is BATCH_L1
    assert registry.kinds["batch_l2"] is BATCH_L2_KIND  # the built-in kinds stay

    # a quantity requests the new kind; every per-sample provider delivers it
    registry = registry_with()
    stat = Statistic(BATCH_L1)
    backends = [b for b in ("hooks", "func", "loop") if b in registry.providers]
    assert len(backends) >= 2
    for problem in (tiny_mlp(), tiny_cnn()):
        for backend in backends:
            recorder = Recorder([stat])
            _, _, batches = train(problem, [recorder], registry, steps=2, backend=backend)
            for step in range(2):
                got = recorder.seen[step][stat.describe()]
                expected = _l1_reference(problem, batches, step)
                for g, e in zip(got, expected, strict=True):
                    torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-14)


def test_a_kind_colliding_with_a_builtin_kind_is_reported():
    fake = StatisticKind(
        "batch_l2", per_sample=True, combine="gather", from_per_sample=lambda g, s, p: g.batch_l2()
    )
    registry = Registry()
    info = registry.add_plugin(
        plugin(register_statistic_kinds=lambda register: register(fake)),
        name="clash",
        distribution="cockpit-clash",
    )
    assert info.ok
    assert registry.kinds["batch_l2"] is BATCH_L2_KIND
    message = str(registry.conflicts["kind:batch_l2"])
    assert "batch_l2" in message and "cockpit-clash" in message
    assert "the one of 'cockpit-core' is used" in message


@pytest.mark.parametrize(
    ("kind", "error"),
    [("batch_l1", "not a cockpit_core.StatisticKind"), (None, "snake_case")],
)
def test_an_invalid_kind_skips_the_plugin(kind, error):
    if kind is None:
        kind = StatisticKind("Batch-L1", per_sample=False, combine="sum")
    registry = Registry()
    info = registry.add_plugin(plugin(register_statistic_kinds=lambda register: register(kind)))
    assert not info.ok and error in info.error
    assert "batch_l1" not in registry.kinds
