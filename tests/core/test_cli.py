"""The `cockpit` command line."""

import json

import pytest

from cockpit_core.cli import main


def test_plugins_lists_distributions_versions_and_state(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "basic  (cockpit-basic 0.1.0)  ok" in out
    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    basic = next(r for r in rows if r["name"] == "basic")
    assert basic["ok"] and "grad_norm" in basic["quantities"] and "economy" in basic["presets"]


def test_quantities_lists_options_with_descriptions(capsys):
    assert main(["quantities", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in data["quantities"]}
    every = next(o for o in rows["loss"]["options"] if o["name"] == "every")
    assert every["type"] == "int | None" and "every this many steps" in every["description"]
    assert "economy" in data["presets"]
    assert main(["quantities"]) == 0
    assert "update_size  [cockpit-basic" in capsys.readouterr().out


def test_schema_is_json_with_a_name_discriminator(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "quantities" in schema["properties"]
    assert '"propertyName": "name"' in json.dumps(schema)


@pytest.mark.parametrize(
    "text, code, message",
    [
        ('quantities = ["loss", { name = "grad_norm", every = 5 }]\n', 0, "valid (2 quantities"),
        ('quantities = ["los"]\n', 1, "quantities.0: Unknown quantity 'los'. Did you mean 'loss'?"),
        (
            'quantities = [{ name = "loss", every = 0 }]\n',
            1,
            "quantities.0.every: Input should be greater",
        ),
        ('debug = "sometimes"\n', 1, "debug: Input should be a valid boolean"),
    ],
)
def test_validate_exit_codes_and_messages(tmp_path, capsys, text, code, message):
    path = tmp_path / "cockpit.toml"
    path.write_text(text)
    assert main(["validate", str(path)]) == code
    captured = capsys.readouterr()
    assert message in (captured.out if code == 0 else captured.err)


def test_validate_prints_every_problem_of_the_file(tmp_path, capsys):
    path = tmp_path / "cockpit.toml"
    path.write_text(
        'debug = "yes"\n'
        'quantities = ["loss", { name = "grad_norm", label = "loss" }, '
        '{ name = "loss", label = "l2", every = true }]\n'
    )
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"Invalid cockpit configuration in {path}:\n"
        "  debug: Input should be a valid boolean, got str 'yes'\n"
        "  quantities.1: 'loss' is tracked twice (also quantities.0); give one of them a "
        "distinct 'label'\n"
        "  quantities.2.every: Input should be a valid integer, got bool True\n"
        "3 problems found.\n"
    )


def test_validate_checks_sinks_without_building_them(tmp_path, capsys):
    path = tmp_path / "cockpit.toml"
    log_dir = tmp_path / "tb"
    path.write_text(
        f'quantities = ["loss"]\nsinks = [{{ name = "tensorboard", log_dir = "{log_dir}" }}]\n'
    )
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid (1 quantities: loss; sinks: tensorboard)\n"
    assert not log_dir.exists()
    path.write_text('quantities = ["loss"]\nsinks = [{ name = "tensorboard", log_dirr = "x" }]\n')
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert (
        "  sinks.0.log_dirr: unknown option of sink 'tensorboard' (check the spelling; its options: log_dir, "
        in err
    )
    assert err.endswith("\n1 problem found.\n")


def test_plugins_lists_sinks_providers_and_conflicts(fake_distribution, monkeypatch, capsys):
    from cockpit_core import Registry
    from cockpit_core import registry as registry_module

    fake_distribution(
        "fakeplug-tb",
        "fakeplug_tb",
        "from cockpit_core import hookimpl\n\n@hookimpl\ndef register_sinks(register):\n"
        "    register('tensorboard', lambda **options: print)\n",
    )
    registry = Registry.from_entry_points()
    monkeypatch.setattr(registry_module, "default_registry", lambda: registry)
    conflict = (
        "The sink name 'tensorboard' is registered by both 'cockpit-tensorboard' and "
        "'fakeplug-tb', so cockpit cannot tell which one you mean. Uninstall one of the "
        "distributions (pip uninstall ...), or ask one author to rename the sink."
    )
    assert main(["plugins", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tensorboard"]["sinks"] == ["tensorboard"]
    assert rows["fakeplug_tb"]["sinks"] == ["tensorboard"] and rows["fakeplug_tb"]["ok"]
    assert rows["fakeplug_tb"]["conflicts"] == [conflict]
    assert rows["tensorboard"]["conflicts"] == [conflict]
    assert rows["basic"]["conflicts"] == []
    assert "func" in rows["core"]["providers"]
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert f"CONFLICT sink:tensorboard: {conflict}\n" in out
    assert "    sinks: tensorboard\n" in out


def test_an_os_error_is_a_message_and_exit_code_1(monkeypatch, capsys):
    from cockpit_core import cli

    def broken(args):
        raise OSError("No space left on device")

    monkeypatch.setattr(cli, "cmd_schema", broken)
    assert main(["schema"]) == 1
    assert capsys.readouterr().err == "error: No space left on device\n"
