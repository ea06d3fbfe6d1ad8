"""Config files and quantity specs: every error names its field path and what to do."""

import json
import types

import pytest
import torch
from pydantic import Field

from cockpit_core import (
    Cockpit,
    ConfigError,
    Quantity,
    QuantityConfig,
    Registry,
    config_json_schema,
    hookimpl,
)


class HistConfig(QuantityConfig):
    bins: int = Field(10, gt=0, description="Number of bins.")


class Hist(Quantity):
    """A configurable test quantity."""

    name = "hist"
    Config = HistConfig

    def compute(self, ctx):
        return self.config.bins


class Loss(Quantity):
    """Test loss."""

    name = "loss"

    def compute(self, ctx):
        return 0.0


def make_registry():
    plugin = types.SimpleNamespace()

    @hookimpl
    def register_quantities(register):
        register(Hist)
        register(Loss)

    @hookimpl
    def register_presets(register):
        register("small", ["loss", {"name": "hist", "bins": 3}])
        register("broken", ["loss", "not_installed_q"])

    plugin.register_quantities = register_quantities
    plugin.register_presets = register_presets
    registry = Registry()
    registry.add_plugin(plugin, name="test", distribution="cockpit-test")
    return registry


@pytest.fixture
def params():
    return [torch.nn.Parameter(torch.zeros(2))]


def test_toml_yaml_and_json_give_the_same_cockpit(tmp_path, params):
    (tmp_path / "c.toml").write_text(
        'on_error = "disable"\nquantities = ["loss", { name = "hist", bins = 7, every = 2 }]\n'
    )
    (tmp_path / "c.yaml").write_text(
        "cockpit:\n  on_error: disable\n  quantities:\n    - loss\n    - {name: hist, bins: 7, every: 2}\n"
    )
    (tmp_path / "c.json").write_text(
        json.dumps(
            {"on_error": "disable", "quantities": ["loss", {"name": "hist", "bins": 7, "every": 2}]}
        )
    )
    for name in ("c.toml", "c.yaml", "c.json"):
        cp = Cockpit.from_config(tmp_path / name, params, registry=make_registry())
        assert [q.key for q in cp.quantities] == ["loss", "hist"]
        assert cp.quantities[1].config.bins == 7 and cp.on_error == "disable"
        assert cp.quantities[1].is_active(4) and not cp.quantities[1].is_active(3)


def test_wrong_option_value_names_the_field_path(params):
    with pytest.raises(ConfigError) as err:
        Cockpit(
            params,
            ["loss", "hist", {"name": "hist", "bins": -1, "label": "h2"}],
            registry=make_registry(),
        )
    assert "quantities.2.bins: Input should be greater than 0" in str(err.value)


def test_unknown_option_says_how_to_find_the_options(params):
    with pytest.raises(ConfigError) as err:
        Cockpit(params, [{"name": "hist", "bnis": 3}], registry=make_registry())
    assert "quantities.0.bnis: unknown option" in str(err.value)
    assert "cockpit quantities" in str(err.value)


def test_unknown_quantity_name_in_a_config_suggests_the_closest(params, tmp_path):
    (tmp_path / "c.toml").write_text('quantities = ["loss", { name = "hsit" }]\n')
    with pytest.raises(ConfigError) as err:
        Cockpit.from_config(tmp_path / "c.toml", params, registry=make_registry())
    msg = str(err.value)
    assert "c.toml" in msg
    assert (
        "quantities.1.name: Unknown quantity 'hsit'. Did you mean 'hist'? Installed: hist, loss"
        in msg
    )


def test_wrong_top_level_field(params, tmp_path):
    (tmp_path / "c.json").write_text('{"quantities": ["loss"], "on_eror": "warn"}')
    with pytest.raises(ConfigError, match="on_eror: unknown option"):
        Cockpit.from_config(tmp_path / "c.json", params, registry=make_registry())
    with pytest.raises(ConfigError, match="on_error: Input should be 'warn', 'disable' or 'raise'"):
        Cockpit(params, ["loss"], on_error="ignore", registry=make_registry())


def test_unparsable_and_missing_files(tmp_path, params):
    (tmp_path / "c.toml").write_text("quantities = [")
    with pytest.raises(ConfigError, match="cannot parse"):
        Cockpit.from_config(tmp_path / "c.toml", params, registry=make_registry())
    with pytest.raises(ConfigError, match="config file not found"):
        Cockpit.from_config(tmp_path / "nope.toml", params, registry=make_registry())
    (tmp_path / "c.ini").write_text("")
    with pytest.raises(ConfigError, match="use .toml, .yaml, .yml or .json"):
        Cockpit.from_config(tmp_path / "c.ini", params, registry=make_registry())


def test_presets_expand_and_missing_members_are_explained(params):
    cp = Cockpit(params, "small", registry=make_registry())
    assert [q.key for q in cp.quantities] == ["loss", "hist"] and cp.quantities[1].config.bins == 3
    with pytest.raises(ConfigError) as err:
        Cockpit(params, "broken", registry=make_registry())
    assert "preset 'broken' (from cockpit-test)" in str(err.value)
    assert "Unknown quantity 'not_installed_q'" in str(err.value)


def test_tracking_a_quantity_twice_needs_a_label(params):
    with pytest.raises(ConfigError, match="tracked twice .* distinct 'label'"):
        Cockpit(params, ["hist", {"name": "hist", "bins": 4}], registry=make_registry())
    cp = Cockpit(
        params, ["hist", {"name": "hist", "bins": 4, "label": "hist_4"}], registry=make_registry()
    )
    assert [q.key for q in cp.quantities] == ["hist", "hist_4"]


def test_entry_without_name_and_wrong_types(params):
    with pytest.raises(ConfigError, match="quantities.0: missing 'name'"):
        Cockpit(params, [{"bins": 3}], registry=make_registry())
    with pytest.raises(ConfigError, match="quantities.0: expected a quantity name"):
        Cockpit(params, [3.5], registry=make_registry())


def test_json_schema_is_a_discriminated_union_over_installed_quantities():
    schema = config_json_schema(make_registry())
    text = json.dumps(schema)
    assert '"discriminator"' in text and '"hist"' in text and '"bins"' in text
    assert schema["properties"]["on_error"]["enum"] == ["warn", "disable", "raise"]
