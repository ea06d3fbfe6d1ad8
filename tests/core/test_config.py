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
from cockpit_core.config.quantities import check_unique_keys


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
    with pytest.raises(ConfigError) as err:
        Cockpit(params, ["hist", {"name": "hist", "bins": 4}], registry=make_registry())
    assert err.value.errors == [
        (
            "quantities.1",
            "'hist' is tracked twice (also quantities.0); give one of them a distinct 'label'",
        )
    ]
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


def test_a_label_that_collides_with_another_key_is_reported_with_the_other_errors(params):
    with pytest.raises(ConfigError) as err:
        Cockpit(
            params,
            ["loss", {"name": "hist", "label": "loss"}, {"name": "hist", "bins": 0}],
            registry=make_registry(),
        )
    assert err.value.errors == [
        ("quantities.2.bins", "Input should be greater than 0"),
        (
            "quantities.1",
            "'loss' is tracked twice (also quantities.0); give one of them a distinct 'label'",
        ),
    ]


def test_a_preset_that_tracks_a_key_twice_says_so(params):
    with pytest.raises(ConfigError) as err:
        Cockpit(params, ["small", "loss"], registry=make_registry())
    assert err.value.errors == [
        (
            "quantities.1",
            "'loss' is tracked twice (also quantities.0); give one of them a distinct 'label'",
        )
    ]


def test_a_quantity_tracked_twice_without_labels_names_both_entries():
    with pytest.raises(ConfigError) as err:
        check_unique_keys([Loss(), Loss()], "c.toml")
    assert str(err.value) == (
        "Invalid cockpit configuration in c.toml:\n"
        "  quantities.1: 'loss' is tracked twice (also quantities.0); give one of them a "
        "distinct 'label'"
    )


@pytest.mark.parametrize(
    "options, field, message",
    [
        ({"debug": "yes"}, "debug", "Input should be a valid boolean, got str 'yes'"),
        ({"debug": 1}, "debug", "Input should be a valid boolean, got int 1"),
        (
            {"keep_in_memory": "false"},
            "keep_in_memory",
            "Input should be a valid boolean, got str 'false'",
        ),
        ({"on_error": 1}, "on_error", "Input should be 'warn', 'disable' or 'raise', got int 1"),
        ({"live_every": True}, "live_every", "Input should be a valid integer, got bool True"),
        ({"chunk_size": "8"}, "chunk_size", "Input should be a valid integer, got str '8'"),
        (
            {"log_fsync_every": True},
            "log_fsync_every",
            "Input should be a valid number, got bool True",
        ),
        ({"log": 3}, "log", "Input should be a valid string, got int 3"),
    ],
)
def test_top_level_options_are_strict(tmp_path, params, options, field, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"quantities": ["loss"], **options}))
    with pytest.raises(ConfigError) as err:
        Cockpit.from_config(path, params, registry=make_registry())
    assert err.value.errors == [(field, message)]


@pytest.mark.parametrize(
    "entry, field, message",
    [
        ({"every": True}, "quantities.0.every", "Input should be a valid integer, got bool True"),
        ({"offset": "2"}, "quantities.0.offset", "Input should be a valid integer, got str '2'"),
        ({"label": 3}, "quantities.0.label", "Input should be a valid string, got int 3"),
        ({"bins": True}, "quantities.0.bins", "Input should be a valid integer, got bool True"),
        ({"bins": "7"}, "quantities.0.bins", "Input should be a valid integer, got str '7'"),
        (
            {"label": "__ndarray__"},
            "quantities.0.label",
            "label '__ndarray__' cannot be an output key: use a non-empty name that does not "
            "start with '__' (reserved for the log format), e.g. 'grad_norm_2'",
        ),
    ],
)
def test_quantity_options_are_strict_also_those_of_plugins(params, entry, field, message):
    with pytest.raises(ConfigError) as err:
        Cockpit(params, [{"name": "hist", **entry}], registry=make_registry())
    assert err.value.errors == [(field, message)]


def test_numbers_tuples_and_schedules_from_files_keep_working(params, tmp_path):
    class RangeConfig(QuantityConfig):
        range: tuple[float, float] = Field((0.0, 1.0), description="Range.")
        scale: float = Field(1.0, description="Scale.")
        flag: bool = Field(False, description="Flag.")

    config = RangeConfig.model_validate(
        {"range": [-1, 2], "scale": 3, "flag": True, "schedule": {"kind": "log", "end": 100}}
    )
    assert config.range == (-1.0, 2.0) and config.scale == 3.0 and config.flag is True
    assert config.resolved_schedule()(100)

    class Ranged(Quantity):
        name = "ranged"
        Config = RangeConfig

    assert Ranged(range=(0, 3)).config.range == (0.0, 3.0)
    with pytest.raises(ConfigError) as err:
        Ranged(range=[True, 1])
    assert err.value.errors == [
        ("ranged.range", "item 0: Input should be a valid number, got bool True")
    ]
