"""Discovery over entry points: isolation of broken plugins, collisions, protocol versions."""

import pytest

from cockpit_core import DuplicateQuantityError, Registry, UnknownQuantityError

GOOD = """
from cockpit_core import Quantity, hookimpl

class Alpha2(Quantity):
    name = "fakeplug_value"
    def compute(self, ctx):
        return 1.0

@hookimpl
def register_quantities(register):
    register(Alpha2)

@hookimpl
def register_presets(register):
    register("fakeplug_preset", ["fakeplug_value", "loss"])
"""


def test_a_plugin_that_fails_to_import_is_reported_and_the_others_load(fake_distribution):
    fake_distribution("fakeplug-broken", "fakeplug_broken", "raise ImportError('no numpy 9')")
    fake_distribution("fakeplug-good", "fakeplug_good", GOOD)
    registry = Registry.from_entry_points()
    broken = next(p for p in registry.plugins if p.name == "fakeplug_broken")
    assert not broken.ok and "import failed: ImportError: no numpy 9" in broken.error
    assert broken.distribution == "fakeplug-broken"
    assert "fakeplug_value" in registry.quantities
    assert "loss" in registry.quantities  # first-party plugins still load
    with pytest.raises(UnknownQuantityError) as err:
        registry.get("fakeplug_missing")
    assert "failed to load" in str(err.value) and "fakeplug_broken" in str(err.value)


def test_a_plugin_whose_hook_raises_is_skipped_whole(fake_distribution):
    fake_distribution(
        "fakeplug-raiser",
        "fakeplug_raiser",
        """
        from cockpit_core import Quantity, hookimpl

        class Fine(Quantity):
            name = "fakeplug_fine"

        @hookimpl
        def register_quantities(register):
            register(Fine)
            raise RuntimeError("boom in hook")
        """,
    )
    registry = Registry.from_entry_points()
    info = next(p for p in registry.plugins if p.name == "fakeplug_raiser")
    assert info.error == "hook raised RuntimeError: boom in hook"
    assert "fakeplug_fine" not in registry.quantities


def test_incompatible_protocol_version_is_skipped(fake_distribution):
    fake_distribution(
        "fakeplug-future", "fakeplug_future", "COCKPIT_PROTOCOL_VERSION = 99\n" + GOOD
    )
    registry = Registry.from_entry_points()
    info = next(p for p in registry.plugins if p.name == "fakeplug_future")
    assert "protocol version 99" in info.error and "upgrade" in info.error
    assert "fakeplug_value" not in registry.quantities


def test_invalid_quantity_class_is_reported(fake_distribution):
    fake_distribution(
        "fakeplug-badname",
        "fakeplug_badname",
        """
        from cockpit_core import Quantity, hookimpl

        class Bad(Quantity):
            name = "BadName"

        @hookimpl
        def register_quantities(register):
            register(Bad)
        """,
    )
    registry = Registry.from_entry_points()
    info = next(p for p in registry.plugins if p.name == "fakeplug_badname")
    assert "not a valid quantity name: use snake_case" in info.error


def test_duplicate_names_across_plugins_name_both_distributions(fake_distribution):
    fake_distribution("fakeplug-a", "fakeplug_a", GOOD)
    fake_distribution("fakeplug-b", "fakeplug_b", GOOD)
    registry = Registry.from_entry_points()
    with pytest.raises(DuplicateQuantityError) as err:
        registry.get("fakeplug_value")
    assert "'fakeplug-a'" in str(err.value) and "'fakeplug-b'" in str(err.value)
    assert "pip uninstall" in str(err.value)
    assert "loss" in registry.quantities


def test_unknown_name_suggests_the_closest_and_lists_installed():
    registry = Registry.from_entry_points()
    with pytest.raises(UnknownQuantityError) as err:
        registry.get("grad_nrom")
    msg = str(err.value)
    assert msg.startswith("Unknown quantity 'grad_nrom'. Did you mean 'grad_norm'? Installed: ")
    assert "loss" in msg and "cockpit quantities" in msg


def test_class_names_are_aliases():
    registry = Registry.from_entry_points()
    assert registry.get("GradNorm") is registry.get("grad_norm")
