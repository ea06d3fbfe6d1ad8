"""The typed register callbacks: each hook's ``register`` is annotated with its protocol."""

import inspect
import typing
from pathlib import Path

import pytest

from cockpit_core import Registry, hookimpl
from cockpit_core.hookspecs import (
    HOOK_NAMES,
    REGISTER_PROTOCOLS,
    RegisterCommand,
    RegisterPreset,
    RegisterRenderer,
    RegisterSink,
    hook_signatures,
)

HOOKS_DOC = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_hook_register_argument_is_typed_with_its_protocol(name):
    protocol = REGISTER_PROTOCOLS[name]
    assert typing.get_type_hints(hook_signatures()[name])["register"] is protocol
    assert protocol._is_protocol and callable(protocol.__call__)
    row = f"| `{name}` | `{protocol.__name__}` |"
    assert row in HOOKS_DOC.read_text(), f"docs/hooks.md: add the row {row} ..."


def test_the_registry_accepts_calls_spelled_as_the_protocols_declare():
    # keyword names of RegisterPreset and RegisterSink; positional single objects elsewhere
    params = {
        name: list(inspect.signature(proto.__call__).parameters.values())[1:]
        for name, proto in REGISTER_PROTOCOLS.items()
    }
    keyword_hooks = {
        "register_presets",
        "register_sinks",
        "register_renderers",
        "register_commands",
    }
    for name in set(HOOK_NAMES) - keyword_hooks:
        assert [p.kind for p in params[name]] == [inspect.Parameter.POSITIONAL_ONLY]
    renderer_kw = dict(
        zip([p.name for p in params["register_renderers"]], [".fp", lambda s, p=None: p, "d"])
    )
    command_kw = dict(
        zip(
            [p.name for p in params["register_commands"]],
            ["fp-cmd", lambda parser: None, lambda args: 0, "d"],
        )
    )
    preset_kw = dict(zip([p.name for p in params["register_presets"]], ["fp_set", ["loss"], "d"]))
    sink_kw = dict(
        zip([p.name for p in params["register_sinks"]], ["fp_sink", lambda: print, None, "d"])
    )

    class Plugin:
        @hookimpl
        def register_presets(self, register: RegisterPreset) -> None:
            register(**preset_kw)

        @hookimpl
        def register_sinks(self, register: RegisterSink) -> None:
            register(**sink_kw)

        @hookimpl
        def register_renderers(self, register: RegisterRenderer) -> None:
            register(**renderer_kw)

        @hookimpl
        def register_commands(self, register: RegisterCommand) -> None:
            register(**command_kw)

    registry = Registry.from_entry_points()
    info = registry.add_plugin(Plugin(), name="fp_typed")
    assert info.ok, info.error
    assert (info.presets, info.sinks) == (["fp_set"], ["fp_sink"])
    assert registry.presets["fp_set"].description == "d"
    assert registry.sinks["fp_sink"].description == "d"
    assert (info.renderers, info.commands) == ([".fp"], ["fp-cmd"])
    assert registry.renderers[".fp"].description == registry.commands["fp-cmd"].help == "d"
