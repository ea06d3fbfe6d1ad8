"""``StatisticProvider.prepare`` and ``Registry.prepare_module``: modules cockpit builds itself."""

from __future__ import annotations

import pytest
import torch

from cockpit_core import CockpitWarning, Registry, StatisticProvider, hookimpl
from cockpit_core.testing import tiny_mlp


class Tagging(StatisticProvider):
    name = "tagging"

    @classmethod
    def prepare(cls, module: torch.nn.Module) -> torch.nn.Module:
        module.tagged = True  # type: ignore[assignment]
        return module


class Broken(StatisticProvider):
    name = "broken"

    @classmethod
    def prepare(cls, module: torch.nn.Module) -> torch.nn.Module:
        raise RuntimeError("cannot prepare this")


class _Plugin:
    def __init__(self, *providers):
        self.providers = providers

    @hookimpl
    def register_statistic_providers(self, register):
        for provider in self.providers:
            register(provider)


def _registry(*providers) -> Registry:
    registry = Registry()
    registry.add_plugin(_Plugin(*providers), name="test_providers", distribution="test-dist")
    return registry


def test_every_installed_provider_prepares_the_module_and_the_default_leaves_it_alone():
    module = torch.nn.Linear(2, 3)
    out = _registry(Tagging).prepare_module(module)
    assert out is module and module.tagged is True
    assert StatisticProvider.prepare(module) is module  # the protocol's default


def test_a_provider_whose_prepare_raises_is_named_and_the_others_still_prepare():
    module = torch.nn.Linear(2, 3)
    with pytest.warns(CockpitWarning, match="'broken' \\(test-dist\\).*cannot prepare this"):
        out = _registry(Broken, Tagging).prepare_module(module)
    assert out is module and module.tagged is True


def test_the_kit_problems_are_extended_for_backpack_through_its_provider():
    hooks = pytest.importorskip("cockpit_backpack.hook_switch")
    model = tiny_mlp().make_model()
    flagged = [getattr(m, hooks.EXTENDED_FLAG, False) for m in model.modules()]
    assert any(flagged), "cockpit-backpack is installed: its provider extends the kit's models"
