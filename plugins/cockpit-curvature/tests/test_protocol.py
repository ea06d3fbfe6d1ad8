"""Every quantity passes the conformance kit, is found by name, and rejects bad options clearly."""

from __future__ import annotations

import pytest
from cockpit_curvature import HessMaxEV, HessTrace, TICDiag, TICTrace

from cockpit_core import ConfigError, default_registry
from cockpit_core.testing import check_quantity, tiny_cnn

QUANTITIES = [HessMaxEV, HessTrace, TICDiag, TICTrace]


@pytest.mark.parametrize("cls", QUANTITIES, ids=lambda c: c.name)
def test_check_quantity(cls):
    check_quantity(cls)


@pytest.mark.parametrize(
    "cls, options",
    [
        (HessMaxEV, {"k": 3, "which": "largest_magnitude", "warm_start": False}),
        (HessTrace, {"method": "hutchinson", "probes": 3}),
        (HessTrace, {"method": "diag_ggn_exact"}),
        (HessTrace, {"method": "diag_ggn_mc", "mc_samples": 2}),
        (TICDiag, {"curvature": "diag_ggn_exact", "negative_curvature": "abs"}),
        (TICTrace, {"curvature": "diag_ggn_mc", "mc_samples": 3}),
    ],
    ids=lambda x: getattr(x, "name", None) or "-".join(f"{k}={v}" for k, v in x.items()),
)
def test_check_quantity_with_options(cls, options):
    check_quantity(cls, options=options)


@pytest.mark.parametrize("cls", QUANTITIES, ids=lambda c: c.name)
def test_check_quantity_on_a_cnn(cls):
    check_quantity(cls, problem=tiny_cnn())


def test_quantities_are_registered_by_name_and_class_name():
    registry = default_registry()
    for cls in QUANTITIES:
        assert registry.get(cls.name) is cls
        assert registry.get(cls.__name__) is cls


def test_cockpit_spelling_diag_h_is_accepted():
    assert HessTrace(method="diag_h").config.method == "diag_hessian"
    assert TICDiag(curvature="diag_h").config.curvature == "diag_hessian"


@pytest.mark.parametrize(
    "cls, options, field",
    [
        (HessTrace, {"method": "exact"}, "hess_trace.method"),
        (HessTrace, {"probes": 5}, "probes applies only to method='hutchinson'"),
        (HessTrace, {"method": "diag_hessian", "mc_samples": 2}, "mc_samples applies only"),
        (TICDiag, {"mc_samples": 2}, "mc_samples applies only to curvature='diag_ggn_mc'"),
        (TICTrace, {"curvature": "hutchpp"}, "tic_trace.curvature"),
        (TICDiag, {"negative_curvature": "clip"}, "tic_diag.negative_curvature"),
        (HessMaxEV, {"k": 5, "basis_size": 6}, "basis_size (6) must be at least k + 2 (7)"),
        (HessMaxEV, {"which": "smallest"}, "hess_max_ev.which"),
        (HessMaxEV, {"tol": 0}, "hess_max_ev.tol"),
        (HessMaxEV, {"max_iters": 3}, "unknown option"),
    ],
)
def test_bad_options_name_the_field_and_the_fix(cls, options, field):
    with pytest.raises(ConfigError, match=None) as info:
        cls(**options)
    assert field in str(info.value)
