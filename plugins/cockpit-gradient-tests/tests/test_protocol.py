"""Every quantity of the plugin passes the conformance kit and is found through its entry point."""

from __future__ import annotations

import pytest
from cockpit_gradient_tests import (
    CABS,
    QUANTITIES,
    EarlyStopping,
    InnerTest,
    MeanGSNR,
    NormTest,
    OrthoTest,
)

from cockpit_core import ConfigError, default_registry
from cockpit_core.testing import check_quantity, tiny_cnn


@pytest.mark.parametrize("cls", QUANTITIES, ids=lambda c: c.name)
def test_check_quantity(cls):
    check_quantity(cls)


@pytest.mark.parametrize(
    "cls, options",
    [
        (MeanGSNR, {"epsilon": 0.0}),
        (EarlyStopping, {"epsilon": 1e-3}),
        (CABS, {"lr": 0.5}),
        (NormTest, {"every": 2}),
    ],
    ids=lambda x: getattr(x, "name", None) or str(x),
)
def test_check_quantity_with_options(cls, options):
    check_quantity(cls, options=options)


@pytest.mark.parametrize("cls", [InnerTest, OrthoTest, CABS], ids=lambda c: c.name)
def test_check_quantity_on_cnn(cls):
    check_quantity(cls, problem=tiny_cnn())


def test_registered_under_names_and_cockpit_class_names():
    registry = default_registry()
    expected = {
        "norm_test": "NormTest",
        "inner_test": "InnerTest",
        "ortho_test": "OrthoTest",
        "mean_gsnr": "MeanGSNR",
        "early_stopping": "EarlyStopping",
        "cabs": "CABS",
    }
    for name, alias in expected.items():
        assert registry.get(name) is registry.get(alias)
        assert registry.quantities[name].distribution == "cockpit-gradient-tests"


@pytest.mark.parametrize(
    "cls, options, field",
    [
        (MeanGSNR, {"epsilon": -1.0}, "epsilon"),
        (EarlyStopping, {"epsilon": "big"}, "epsilon"),
        (CABS, {"lr": 0.0}, "lr"),
    ],
)
def test_bad_options_name_the_field(cls, options, field):
    with pytest.raises(ConfigError, match=f"{cls.name}.{field}"):
        cls(**options)


def test_defaults_match_cockpit_1_0_2():
    assert MeanGSNR().config.epsilon == 1e-5
    assert EarlyStopping().config.epsilon == 1e-5
    assert CABS().config.lr is None
