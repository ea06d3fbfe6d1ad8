"""One test per hook spec (the meta-test checks that each hook has a `test_hook_<name>`)."""

import types

from cockpit_core import Cockpit, Quantity, Registry, hookimpl


def test_hook_register_quantities():
    class Q(Quantity):
        name = "q_from_hook"

        def compute(self, ctx):
            return 1

    plugin = types.SimpleNamespace()

    @hookimpl
    def register_quantities(register):
        register(Q)

    plugin.register_quantities = register_quantities
    registry = Registry()
    info = registry.add_plugin(plugin, name="p", distribution="dist-p", version="2.0")
    assert info.ok and info.quantities == ["q_from_hook"]
    entry = registry.quantities["q_from_hook"]
    assert (entry.cls, entry.distribution, entry.version) == (Q, "dist-p", "2.0")


def test_hook_register_presets():
    class Q(Quantity):
        name = "q"

        def compute(self, ctx):
            return 1

    plugin = types.SimpleNamespace()

    @hookimpl
    def register_quantities(register):
        register(Q)

    @hookimpl
    def register_presets(register):
        register("mine", ["q", {"name": "q", "label": "q_every_2", "every": 2}], "two qs")

    plugin.register_quantities = register_quantities
    plugin.register_presets = register_presets
    registry = Registry()
    registry.add_plugin(plugin, name="p")
    assert registry.preset("mine").description == "two qs"
    import torch

    cp = Cockpit([torch.nn.Parameter(torch.zeros(1))], "mine", registry=registry)
    assert [q.key for q in cp.quantities] == ["q", "q_every_2"]
