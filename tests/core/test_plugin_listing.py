"""`cockpit plugins -v` and `--json`: what each plugin implements and registers."""

import json

import pytest

from cockpit_core import Registry
from cockpit_core.cli.main import main


@pytest.fixture
def listing(monkeypatch, capsys):
    """Run ``cockpit plugins ARGS``; return stdout.

    The plugins are discovered at the first run (after the test installed its own), once.
    """
    from cockpit_core.plugin import registry as registry_module

    registries = []

    def registry() -> Registry:
        if not registries:
            registries.append(Registry.from_entry_points())
        return registries[0]

    monkeypatch.setattr(registry_module, "default_registry", registry)

    def run(*args: str) -> str:
        capsys.readouterr()
        assert main(["plugins", *args]) == 0
        return capsys.readouterr().out

    return run


def test_verbose_lists_hooks_and_registrations_of_first_party_plugins(listing):
    out = listing("-v")
    assert (
        "basic  (cockpit-basic 0.1.0)  ok\n"
        "    hooks: register_quantities, register_presets, register_instruments\n"
        "    quantities: loss, parameters, distance, update_size, grad_norm, time, "
        "optimizer_hparams\n"
        "    presets: economy, business, full, basic\n"
        "    instruments: loss, hyperparameters, performance, time, distance, grad_norm, "
        "parameters, grad_norm_layers\n"
    ) in out
    assert (
        "backpack  (cockpit-backpack 0.1.0)  ok\n"
        "    hooks: register_statistic_providers\n"
        "    providers: backpack\n"
    ) in out
    assert (
        "tensorboard  (cockpit-tensorboard 0.1.0)  ok\n"
        "    hooks: register_sinks\n"
        "    sinks: tensorboard\n"
    ) in out
    # the core's built-ins come in through the same hooks as a third party's
    assert (
        "core  (cockpit-core 0.3.0)  ok\n"
        "    hooks: register_statistic_providers, register_statistic_kinds\n"
        "    providers: func\n"
        "    statistic kinds: batch_l2, sum_grad_squared, batch_dot, grad_batch, "
        "batch_projection, transform, diag_hessian, diag_ggn_exact, diag_ggn_mc\n"
    ) in out


def test_without_verbose_the_listing_is_short(listing):
    out = listing()
    assert "    hooks: " not in out and "    instruments: " not in out
    assert "basic  (cockpit-basic 0.1.0)  ok\n    quantities: loss, " in out


def test_json_has_every_field(listing):
    rows = {r["name"]: r for r in json.loads(listing("--json"))}
    basic = rows["basic"]
    assert basic["hooks"] == ["register_quantities", "register_presets", "register_instruments"]
    assert "grad_norm_layers" in basic["instruments"]
    assert basic["kinds"] == [] and basic["extension_error"] is None
    assert rows["backpack"]["providers"] == ["backpack"]
    assert rows["backpack"]["hooks"] == ["register_statistic_providers"]
    assert rows["tensorboard"]["sinks"] == ["tensorboard"]
    assert rows["tensorboard"]["hooks"] == ["register_sinks"]
    assert rows["hooks"]["providers"] == ["hooks"]
    assert json.loads(listing("--json", "-v")) == list(rows.values())


KINDS_PLUGIN = """
from cockpit_core import StatisticKind, hookimpl

@hookimpl
def register_statistic_kinds(register):
    register(StatisticKind("fakeplug_l1", per_sample=False, combine="sum"))

@hookimpl
def register_instruments(register):
    raise RuntimeError("no panels today")
"""


def test_verbose_lists_statistic_kinds_and_skipped_panels(fake_distribution, listing):
    fake_distribution("fakeplug-kinds", "fakeplug_kinds", KINDS_PLUGIN)
    fake_distribution("fakeplug-typo", "fakeplug_typo", KINDS_PLUGIN.replace("kinds(", "kind("))
    with pytest.warns(UserWarning, match="no panels today"):
        out = listing("-v")
    skipped = (
        "'fakeplug_kinds' (fakeplug-kinds): register_instruments/register_sinks raised "
        "RuntimeError: no panels today; its panels and sinks are skipped, its quantities "
        "still work."
    )
    assert (
        "fakeplug_kinds  (fakeplug-kinds 1.0)  ok\n"
        "    hooks: register_instruments, register_statistic_kinds\n"
        "    statistic kinds: fakeplug_l1\n"
        f"    panels/sinks skipped: {skipped}\n"
    ) in out
    assert (
        "fakeplug_typo  (fakeplug-typo 1.0)  SKIPPED: invalid hook implementation: unknown hook "
        "'register_statistic_kind' (did you mean 'register_statistic_kinds'?); cockpit's hooks "
        "are register_quantities, register_presets, register_instruments, register_sinks, "
        "register_statistic_providers, register_statistic_kinds, register_diagnoses, "
        "register_renderers, register_commands\n"
        "    hooks: register_instruments\n"  # its known hooks; it registered nothing
    ) in out
