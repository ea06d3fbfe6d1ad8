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
