"""Cockpit 1.0.2's quantity classes, schedules and configurations map onto native options."""

from __future__ import annotations

import pytest
from cockpit_compat import quantities
from cockpit_compat.quantities.bin_adaptation import GradAbsMax, NoAdaptation, ParamAbsMax
from cockpit_compat.utils import schedules
from cockpit_compat.utils.configuration import (
    configuration,
    quantities_cls_for_configuration,
)

from cockpit_core.schedules import EveryN, ExplicitSteps

EVERY = schedules.linear(1)

NO_OPTIONS = {
    "Alpha": "alpha",
    "CABS": "cabs",
    "Distance": "distance",
    "GradNorm": "grad_norm",
    "InnerTest": "inner_test",
    "Loss": "loss",
    "NormTest": "norm_test",
    "OrthoTest": "ortho_test",
    "Parameters": "parameters",
    "Time": "time",
    "UpdateSize": "update_size",
}


def test_the_19_classes_are_exported():
    names = {n for n in quantities.__all__ if n[0].isupper() and n not in ("Quantity",)}
    names.discard("LEGACY_CLASSES")
    assert len(names) == 19 and names == set(quantities.LEGACY_CLASSES)


@pytest.mark.parametrize("cls_name, native", sorted(NO_OPTIONS.items()))
def test_quantities_without_options_map_by_name(cls_name, native):
    q = getattr(quantities, cls_name)(schedules.linear(3))
    n = q.to_native()
    assert n.name == native and n.key == native
    assert n.schedule == EveryN(every=3)  # as data: it appears in the log header
    assert [q.should_compute(s) for s in range(5)] == [True, False, False, True, False]


@pytest.mark.parametrize(
    "make, native, expected",
    [
        (lambda: quantities.HessMaxEV(EVERY), "hess_max_ev", {"which": "largest_magnitude"}),
        (
            lambda: quantities.HessMaxEV(EVERY, use_power=False),
            "hess_max_ev",
            {"which": "largest_algebraic"},
        ),
        (lambda: quantities.HessTrace(EVERY), "hess_trace", {"method": "diag_hessian"}),
        (
            lambda: quantities.HessTrace(EVERY, curvature="diag_ggn_mc"),
            "hess_trace",
            {"method": "diag_ggn_mc"},
        ),
        (
            lambda: quantities.TICDiag(EVERY),
            "tic_diag",
            {"curvature": "diag_hessian", "epsilon": 1e-7, "negative_curvature": "keep"},
        ),
        (
            lambda: quantities.TICTrace(EVERY, curvature="diag_ggn_exact", epsilon=1e-3),
            "tic_trace",
            {"curvature": "diag_ggn_exact", "epsilon": 1e-3},
        ),
        (lambda: quantities.EarlyStopping(EVERY), "early_stopping", {"epsilon": 1e-5}),
        (lambda: quantities.MeanGSNR(EVERY, epsilon=0.5), "mean_gsnr", {"epsilon": 0.5}),
        (
            lambda: quantities.GradHist1d(EVERY),
            "grad_hist_1d",
            {"bins": 100, "range": (-2.0, 2.0), "adapt": None},
        ),
        (
            lambda: quantities.GradHist1d(
                EVERY, bins=10, range=[-1, 3], adapt=GradAbsMax(EVERY, padding=0.1)
            ),
            "grad_hist_1d",
            {"bins": 10, "range": (-1.0, 3.0)},
        ),
        (
            lambda: quantities.GradHist2d(EVERY),
            "grad_hist_2d",
            {
                "bins": (40, 50),
                "range": ((-1.0, 1.0), (-2.0, 2.0)),
                "adapt": (None, None),
                "keep_individual": False,
            },
        ),
        (
            lambda: quantities.GradHist2d(
                EVERY,
                bins=[5, 6],
                range=[[-1, 1], [-3, 3]],
                adapt=(NoAdaptation(), ParamAbsMax(schedules.linear(1), min_size=0.5)),
                keep_individual=True,
            ),
            "grad_hist_2d",
            {"bins": (5, 6), "range": ((-1.0, 1.0), (-3.0, 3.0)), "keep_individual": True},
        ),
    ],
)
def test_options_map_onto_the_native_options(make, native, expected):
    n = make().to_native()
    assert n.name == native
    config = n.config.model_dump()
    assert {k: config[k] for k in expected} == expected


def test_range_adaptation_policies_map_onto_native_adapt():
    n = quantities.GradHist1d(EVERY, adapt=GradAbsMax(EVERY, padding=0.1, min_size=0.2))
    adapt = n.to_native().config.adapt
    assert (adapt.kind, adapt.padding, adapt.min_size) == ("grad_abs_max", 0.1, 0.2)
    n2 = quantities.GradHist2d(EVERY, adapt=(None, ParamAbsMax(schedules.linear(1))))
    x, y = n2.to_native().config.adapt
    assert x is None and (y.kind, y.padding, y.min_size) == ("param_abs_max", 0.0, 1e-6)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: quantities.HessTrace(EVERY, curvature="diag"), "curvature='diag'"),
        (lambda: quantities.TICDiag(EVERY, curvature="hutchinson"), "curvature='hutchinson'"),
        (lambda: quantities.HessMaxEV(EVERY, use_power="yes"), "use_power"),
        (lambda: quantities.GradHist1d(EVERY, range=(1, 1)), "GradHist1d: range"),
        (lambda: quantities.GradHist1d(EVERY, bins=0), "GradHist1d: bins"),
        (lambda: quantities.EarlyStopping(EVERY, epsilon=-1.0), "EarlyStopping: epsilon"),
        (lambda: quantities.GradHist2d(EVERY, bins=(0, 3)), "GradHist2d: bins"),
        (lambda: quantities.GradHist2d(EVERY, adapt=None), "two entries"),
        (
            lambda: quantities.GradHist1d(EVERY, adapt=GradAbsMax(schedules.linear(2))),
            "track_schedule different from its histogram's",
        ),
        (lambda: quantities.GradHist1d(EVERY, adapt="grad_abs_max"), "not a policy"),
    ],
)
def test_unsupported_or_invalid_options_are_refused(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_a_schedule_must_be_callable_and_new_classes_are_refused():
    with pytest.raises(TypeError, match="track_schedule"):
        quantities.GradNorm(5)

    class Mine(quantities.Quantity):
        pass

    with pytest.raises(TypeError, match="native protocol"):
        Mine(EVERY)


def test_a_callable_schedule_is_passed_through():
    def even(step):
        return step % 2 == 0

    assert quantities.GradNorm(even).to_native().schedule is even


def test_distance_also_tracks_step_zero_where_its_schedule_does_not():
    later = schedules.linear(2, offset=1)
    native = quantities.Distance(later).to_native()
    assert [native.is_active(s) for s in range(5)] == [True, True, False, True, False]
    assert quantities.Distance(EVERY).to_native().schedule == EVERY


def test_hess_max_ev_needs_the_graph_on_its_schedule():
    q = quantities.HessMaxEV(schedules.linear(2))
    assert [q.create_graph(s) for s in range(3)] == [True, False, True]
    assert quantities.GradNorm(EVERY).create_graph(0) is False


def test_linear_is_1_0_2s_schedule():
    assert schedules.linear(3, offset=2) == EveryN(every=3, offset=2)
    assert [s for s in range(12) if schedules.linear(3, offset=2)(s)] == [2, 5, 8, 11]
    assert [s for s in range(8) if schedules.linear(3, offset=-1)(s)] == [2, 5]
    with pytest.raises(ValueError, match="at least 1"):
        schedules.linear(0)


def test_logarithmic_is_1_0_2s_schedule():
    # exponents, not steps; integer cast truncates (10**0.5 = 3.16 -> 3); 0 added by init
    assert schedules.logarithmic(0, 2, steps=5) == ExplicitSteps(steps={0, 1, 3, 10, 31, 100})
    assert schedules.logarithmic(0, 3, steps=7, base=2, init=False).steps == {1, 2, 4, 5, 8}
    assert len(schedules.logarithmic(0, 5).steps) <= 301
    assert schedules.logarithmic(0, 1, steps=4)(4) and not schedules.logarithmic(0, 1, 4)(3)


@pytest.mark.parametrize(
    "label, names",
    [
        (
            "economy",
            "Alpha Distance GradHist1d GradNorm InnerTest Loss NormTest OrthoTest UpdateSize",
        ),
        (
            "business",
            "Alpha Distance GradHist1d GradNorm InnerTest Loss NormTest OrthoTest UpdateSize "
            "TICDiag HessTrace",
        ),
        (
            "full",
            "Alpha Distance GradHist1d GradNorm InnerTest Loss NormTest OrthoTest UpdateSize "
            "TICDiag HessTrace HessMaxEV GradHist2d",
        ),
    ],
)
def test_configurations_hold_1_0_2s_quantities(label, names):
    assert [c.__name__ for c in quantities_cls_for_configuration(label)] == names.split()
    made = configuration(label, verbose=True)
    assert [type(q).__name__ for q in made] == names.split()
    assert all(q.verbose and q.to_native().schedule == EveryN(every=1) for q in made)
    every3 = schedules.linear(3)
    assert all(q.to_native().schedule == every3 for q in configuration(label, every3))


def test_an_unknown_configuration_is_refused():
    with pytest.raises(ValueError, match="'economy', 'business' or 'full'"):
        configuration("first")


def test_the_migration_guide_lists_every_class_with_its_native_quantity():
    from pathlib import Path

    guide = (Path(__file__).parents[3] / "docs" / "migrating.md").read_text()
    rows = [line for line in guide.splitlines() if line.startswith("| `")]
    for name, cls in quantities.LEGACY_CLASSES.items():
        row = next((r for r in rows if r.startswith(f"| `{name}") or f", `{name}`" in r), None)
        assert row is not None and f"`{cls.native_name}`" in row, name
