"""Sinks: plugins add destinations that receive every record (register_sinks hook)."""

import pytest
from pydantic import BaseModel, ConfigDict, Field

from cockpit_core import CockpitWarning, ConfigError, Registry, UnknownSinkError
from cockpit_core.log import read_records
from cockpit_core.testing import run_cockpit, tiny_mlp

from ._helpers import make_plugin


class ListSink:
    instances: list["ListSink"] = []

    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.records = []
        self.closed = False
        ListSink.instances.append(self)

    def __call__(self, record):
        self.records.append(record)

    def close(self):
        self.closed = True


class ListSinkConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix: str = Field("", description="A made-up option.")


def _registry():
    import cockpit_basic.plugin

    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic")
    plugin = make_plugin(
        quantities=(),
        sinks=[("memory", ListSink, {"config": ListSinkConfig, "description": "keeps records"})],
    )
    registry.add_plugin(plugin, name="memory_plugin", distribution="cockpit-memory")
    return registry


def test_hook_register_sinks(tmp_path):
    registry = _registry()
    assert registry.sinks["memory"].distribution == "cockpit-memory"
    ListSink.instances.clear()
    result = run_cockpit(
        tiny_mlp(),
        ["loss", "update_size"],
        steps=3,
        registry=registry,
        sinks=[{"name": "memory", "prefix": "run1"}],
        log=tmp_path / "log.jsonl",
    )
    result.cockpit.close()
    (sink,) = ListSink.instances
    assert sink.prefix == "run1" and sink.closed
    # the sink sees exactly what the log sees
    logged = read_records(tmp_path / "log.jsonl")
    assert [r["kind"] for r in sink.records] == [r["kind"] for r in logged]
    assert sink.records[0]["kind"] == "header"
    steps = [r["step"] for r in sink.records if r["kind"] == "values"]
    assert steps == [0, 0, 1, 1, 2]  # update_size of step s arrives during step s + 1


def test_register_sinks_options_are_validated():
    with pytest.raises(ConfigError, match="sinks.memory.prefx"):
        _registry().make_sink({"name": "memory", "prefx": "x"})
    with pytest.raises(UnknownSinkError, match="Unknown sink 'memroy'.*Did you mean 'memory'"):
        _registry().make_sink("memroy")
    with pytest.raises(TypeError, match="registered name"):
        _registry().make_sink(42)


def test_a_callable_is_a_sink_and_a_broken_sink_is_removed():
    seen = []

    def broken(record):
        if record["kind"] == "values":
            raise OSError("disk full")

    with pytest.warns(CockpitWarning, match="sink .* failed and was removed: disk full"):
        result = run_cockpit(tiny_mlp(), ["loss"], steps=3, sinks=[seen.append, broken])
    assert broken not in result.cockpit.sinks
    values = [r.get("step") for r in seen if r["kind"] != "cost"]
    assert values == [None, 0, 1, 2]  # training and the others go on
    assert [r["step"] for r in seen if r["kind"] == "cost"] == [0, 1]  # 2's: at close


def test_register_sinks_factory_must_be_callable():
    registry = Registry()
    with pytest.warns(UserWarning, match="not callable"):
        registry.add_plugin(make_plugin(quantities=(), sinks=[("bad", 3)]), name="bad")
    assert "bad" not in registry.sinks
