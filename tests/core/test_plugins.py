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


def test_a_plugin_calling_sys_exit_at_import_is_skipped_and_reported(fake_distribution):
    fake_distribution("fakeplug-exit", "fakeplug_exit", "import sys\nsys.exit(3)\n")
    fake_distribution("fakeplug-good", "fakeplug_good", GOOD)
    registry = Registry.from_entry_points()
    info = next(p for p in registry.plugins if p.name == "fakeplug_exit")
    assert not info.ok
    assert info.error.startswith(
        "import failed: SystemExit: 3 (the plugin called sys.exit() or raised SystemExit) ("
    )
    assert info.error.endswith("fakeplug_exit.py:2)")
    assert "fakeplug_value" in registry.quantities and "loss" in registry.quantities


def test_any_base_exception_but_keyboard_interrupt_is_contained(fake_distribution):
    fake_distribution(
        "fakeplug-base",
        "fakeplug_base",
        "class Odd(BaseException):\n    pass\n\nraise Odd('not an Exception')\n",
    )
    fake_distribution(
        "fakeplug-hookexit",
        "fakeplug_hookexit",
        """
        import sys
        from cockpit_core import hookimpl

        @hookimpl
        def register_quantities(register):
            sys.exit()
        """,
    )
    registry = Registry.from_entry_points()
    infos = {p.name: p for p in registry.plugins}
    assert infos["fakeplug_base"].error.startswith("import failed: Odd: not an Exception (")
    assert infos["fakeplug_hookexit"].error == (
        "hook raised SystemExit: None (the plugin called sys.exit() or raised SystemExit)"
    )
    assert "loss" in registry.quantities


def test_keyboard_interrupt_in_a_plugin_is_not_swallowed(fake_distribution):
    fake_distribution("fakeplug-ctrlc", "fakeplug_ctrlc", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        Registry.from_entry_points()


def test_a_panel_hook_raising_system_exit_costs_only_the_panels(fake_distribution):
    fake_distribution(
        "fakeplug-panelexit",
        "fakeplug_panelexit",
        GOOD
        + """
import sys

@hookimpl
def register_sinks(register):
    sys.exit("no sinks today")
""",
    )
    with pytest.warns(UserWarning, match="register_instruments/register_sinks raised SystemExit"):
        registry = Registry.from_entry_points()
    assert "fakeplug_value" in registry.quantities
    assert registry.extension_errors["fakeplug_panelexit"] == (
        "'fakeplug_panelexit' (fakeplug-panelexit): register_instruments/register_sinks raised "
        "SystemExit: no sinks today (the plugin called sys.exit() or raised SystemExit); its "
        "panels and sinks are skipped, its quantities still work."
    )


SINK_PLUGIN = """
from cockpit_core import hookimpl

@hookimpl
def register_sinks(register):
    register("tensorboard", lambda **options: print, None, "Not the real TensorBoard sink.")
"""


def test_a_sink_named_like_a_first_party_one_is_a_conflict_when_used(fake_distribution):
    fake_distribution("fakeplug-tb", "fakeplug_tb", SINK_PLUGIN)
    registry = Registry.from_entry_points()
    expected = (
        "The sink name 'tensorboard' is registered by both 'cockpit-tensorboard' and "
        "'fakeplug-tb', so cockpit cannot tell which one you mean. Uninstall one of the "
        "distributions (pip uninstall ...), or ask one author to rename the sink."
    )
    assert str(registry.conflicts["sink:tensorboard"]) == expected
    with pytest.raises(DuplicateQuantityError) as err:
        registry.make_sink("tensorboard")
    assert str(err.value) == expected
    from cockpit_core import ConfigError
    from cockpit_core.config.files import validate_config_data

    with pytest.raises(ConfigError) as err:
        validate_config_data(
            {"quantities": ["loss"], "sinks": [{"name": "tensorboard", "log_dir": "x"}]}, registry
        )
    assert err.value.errors == [("sinks.0.name", expected)]


def test_three_distributions_with_one_sink_name_are_all_named(fake_distribution):
    fake_distribution("fakeplug-tb", "fakeplug_tb", SINK_PLUGIN)
    fake_distribution("fakeplug-tb2", "fakeplug_tb2", SINK_PLUGIN)
    registry = Registry.from_entry_points()
    assert str(registry.conflicts["sink:tensorboard"]).startswith(
        "The sink name 'tensorboard' is registered by 'cockpit-tensorboard', 'fakeplug-tb' "
        "and 'fakeplug-tb2', so"
    )


def test_preset_and_quantity_collisions_name_both_distributions(fake_distribution):
    fake_distribution(
        "fakeplug-presets",
        "fakeplug_presets",
        """
        from cockpit_core import hookimpl

        @hookimpl
        def register_presets(register):
            register("economy", ["loss"])
            register("grad_norm", ["loss"])
        """,
    )
    registry = Registry.from_entry_points()
    with pytest.raises(DuplicateQuantityError) as err:
        registry.preset("economy")
    assert str(err.value) == (
        "The name 'economy' is registered by both 'cockpit-basic' and 'fakeplug-presets', so "
        "cockpit cannot tell which one you mean. Uninstall one of the distributions (pip "
        "uninstall ...), or ask one author to rename the quantity or preset."
    )
    with pytest.raises(DuplicateQuantityError, match="'cockpit-basic' and 'fakeplug-presets'"):
        registry.get("grad_norm")


VALID_HOOKS = (
    "register_quantities, register_presets, register_instruments, register_sinks, "
    "register_statistic_providers, register_statistic_kinds, register_diagnoses, "
    "register_renderers, register_commands"
)


def _module(name, **attributes):
    import types

    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def test_a_misspelled_hook_is_an_error_with_a_did_you_mean():
    from cockpit_core import Quantity, hookimpl

    class Typo(Quantity):
        name = "fakeplug_typo"

    @hookimpl
    def register_quantity(register):
        register(Typo)

    registry = Registry()
    info = registry.add_plugin(
        _module("fakeplug_typo", register_quantity=register_quantity), name="fakeplug_typo"
    )
    assert not info.ok
    assert info.error == (
        "invalid hook implementation: unknown hook 'register_quantity' (did you mean "
        f"'register_quantities'?); cockpit's hooks are {VALID_HOOKS}"
    )
    assert "fakeplug_typo" not in registry.quantities
    assert registry.plugin_manager.get_plugin("fakeplug_typo") is None
    assert "register_quantity" not in vars(registry.plugin_manager.hook)


def test_several_unknown_hooks_are_all_named_and_the_known_ones_listed():
    from cockpit_core import hookimpl

    @hookimpl
    def register_sink(register):
        pass

    @hookimpl
    def setup():
        pass

    @hookimpl
    def register_presets(register):
        register("fakeplug_preset", ["loss"])

    registry = Registry()
    info = registry.add_plugin(
        _module(
            "fakeplug_many",
            register_sink=register_sink,
            setup=setup,
            register_presets=register_presets,
        ),
        name="fakeplug_many",
    )
    assert info.error == (
        "invalid hook implementation: unknown hooks 'register_sink' (did you mean "
        f"'register_sinks'?), 'setup'; cockpit's hooks are {VALID_HOOKS}"
    )
    assert info.hooks == ["register_presets"]
    assert "fakeplug_preset" not in registry.presets


def test_unmarked_helpers_optional_hooks_and_specname_are_accepted():
    from cockpit_core import Quantity, hookimpl

    class Named(Quantity):
        name = "fakeplug_named"

    def register_helper(register):  # not marked: not a hook
        raise AssertionError("never called")

    @hookimpl(optionalhook=True)
    def register_future_things(register):  # a hook of a newer cockpit: tolerated
        raise AssertionError("never called")

    @hookimpl(specname="register_quantities")
    def my_quantities(register):
        register(Named)

    registry = Registry()
    info = registry.add_plugin(
        _module(
            "fakeplug_fine",
            register_helper=register_helper,
            register_future_things=register_future_things,
            my_quantities=my_quantities,
        ),
        name="fakeplug_fine",
    )
    assert info.ok, info.error
    assert info.hooks == ["register_quantities"]
    assert info.quantities == ["fakeplug_named"]


def test_an_installed_plugin_with_a_misspelled_hook_is_skipped_and_listed(
    fake_distribution, monkeypatch, capsys
):
    from cockpit_core.cli.main import main
    from cockpit_core.plugin import registry as registry_module

    fake_distribution(
        "fakeplug-typo",
        "fakeplug_typo",
        GOOD.replace("def register_quantities", "def register_quantites"),
    )
    registry = Registry.from_entry_points()
    info = next(p for p in registry.plugins if p.name == "fakeplug_typo")
    message = (
        "invalid hook implementation: unknown hook 'register_quantites' (did you mean "
        f"'register_quantities'?); cockpit's hooks are {VALID_HOOKS}"
    )
    assert info.error == message
    assert "fakeplug_value" not in registry.quantities
    assert "fakeplug_preset" not in registry.presets  # skipped whole, like any load error
    assert "loss" in registry.quantities
    monkeypatch.setattr(registry_module, "default_registry", lambda: registry)
    assert main(["plugins"]) == 0
    assert f"fakeplug_typo  (fakeplug-typo 1.0)  SKIPPED: {message}\n" in capsys.readouterr().out
