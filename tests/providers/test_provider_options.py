"""Options of one provider: ``Cockpit(provider_options={name: {...}})`` and config files."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from cockpit_core import Cockpit, ConfigError, Registry
from cockpit_core.plugin.registry import ProviderEntry
from cockpit_core.testing import tiny_mlp

from .loop_provider import LoopProvider


class LoopOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chunk: int = 4
    label: str = "loop"


class TunableLoop(LoopProvider):
    options_model = LoopOptions


def _registry() -> Registry:
    registry = Registry.from_entry_points()
    registry.providers["loop"] = ProviderEntry(TunableLoop, "<test>", "0")
    return registry


def _cockpit(**settings):
    model = tiny_mlp().make_model()
    return Cockpit(model.named_parameters(), ["loss"], registry=_registry(), **settings)


def test_a_providers_own_options_reach_it_validated_and_next_to_the_shared_ones():
    cp = _cockpit(provider_options={"loop": {"chunk": 2}}, chunk_size=3)
    provider = cp._router.providers["loop"]
    assert provider.options == {"chunk_size": 3, "chunk": 2}  # unset options stay unset
    assert cp._router.providers["func"].options == {"chunk_size": 3}  # only its own


def test_unknown_providers_and_options_are_config_errors_naming_the_path():
    with pytest.raises(ConfigError) as err:
        _cockpit(provider_options={"lop": {}, "loop": {"chunks": 2, "chunk": "x"}})
    paths = [path for path, _ in err.value.errors]
    assert paths == [
        "provider_options.lop",
        "provider_options.loop.chunk",
        "provider_options.loop.chunks",
    ]
    messages = dict(err.value.errors)
    assert "no installed statistics provider 'lop'" in messages["provider_options.lop"]
    assert "func" in messages["provider_options.lop"] and "loop" in messages["provider_options.lop"]


def test_a_provider_without_options_refuses_them():
    with pytest.raises(ConfigError, match="the provider 'func' takes no options"):
        _cockpit(provider_options={"func": {"x": 1}})


def test_the_config_file_table_is_the_same_setting(tmp_path):
    path = tmp_path / "cockpit.toml"
    path.write_text('quantities = ["loss"]\n[provider_options.loop]\nchunk = 5\n')
    model = tiny_mlp().make_model()
    cp = Cockpit.from_config(path, model.named_parameters(), registry=_registry())
    assert cp._router.providers["loop"].options["chunk"] == 5
