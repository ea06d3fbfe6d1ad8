"""Hook implementations are called through pluggy, so pluggy's tracing and monitoring see them."""

import types

from cockpit_core import Quantity, Registry, Requirements, hookimpl


class Constant(Quantity):
    name = "traced_constant"
    REQUIREMENTS = Requirements()

    def compute(self, ctx):
        return 1.0


def test_pluggy_tracing_sees_each_registration_hook():
    registry = Registry()
    seen = []
    registry.plugin_manager.trace.root.setwriter(seen.append)
    undo = registry.plugin_manager.enable_tracing()
    try:
        plugin = types.SimpleNamespace(
            register_quantities=hookimpl(lambda register: register(Constant))
        )
        info = registry.add_plugin(plugin, name="traced", distribution="cockpit-traced")
    finally:
        undo()
    assert info.ok and info.quantities == ["traced_constant"]
    text = "".join(seen)
    assert "register_quantities" in text and "register_sinks" in text
