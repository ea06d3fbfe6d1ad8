"""update_ratio_range: a layer whose updates stay too large or too small a share of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cockpit_diagnoses import UpdateRatioRange
from pydantic import ValidationError

from cockpit_core.diagnosis import Window
from cockpit_core.plugin.registry import default_registry

needs_health = pytest.mark.skipif(
    "update_ratio" not in default_registry().quantities,
    reason="needs cockpit-health (update_ratio)",
)


@needs_health
@pytest.mark.parametrize(
    ("factor", "side", "bound"), [(100.0, "high", "above 0.1"), (1e-5, "low", "below 1e-05")]
)
def test_a_layer_with_a_far_off_learning_rate_is_named(layers, factor, side, bound):
    # the first layer's weight trains with 100x (30) or 1e-5x (3e-6) the others' lr 0.3
    out, header = layers(["update_ratio"], steps=40, lr=0.3, factors={"0.weight": factor})
    (f,) = UpdateRatioRange().check(Window(out, header=header))
    assert f.id == f"update_ratio_range/{side}/0.weight@10"  # judged from step 10 on
    assert (f.severity, f.evidence["parameter"], f.evidence["side"]) == (
        "warning",
        "0.weight",
        side,
    )
    assert f.last_step >= 30 and f.evidence["steps_flagged"] >= 20
    ratios = [out[s]["update_ratio"]["per_param"][0] for s in range(f.first_step, f.last_step + 1)]
    assert f.evidence["median_ratio"] == pytest.approx(float(np.median(ratios)), rel=1e-12)
    assert f"the update ratio of 0.weight is {bound}" in f.message
    assert "param group of 0.weight" in f.suggestion
    assert f.advice == {"learning_rate": "down" if side == "high" else "up"}


# -- synthetic windows ---------------------------------------------------------------------

HEADER = {"params": [{"name": "w", "shape": [4, 3]}, {"name": "b", "shape": [4]}]}


def _window(rows, header=HEADER, start=0):
    return Window(
        {start + s: {"update_ratio": {"total": 1e-3, "per_param": r}} for s, r in enumerate(rows)},
        header=header,
    )


@pytest.mark.parametrize(("count", "found"), [(4, False), (5, True)])
def test_min_steps_consecutive_tracked_steps_out_of_range(count, found):
    rows = [[1e-3, 1e-3]] * 12 + [[0.5, 1e-3]] * count + [[1e-3, 1e-3]] * 3
    findings = UpdateRatioRange().check(_window(rows))
    assert bool(findings) is found
    if found:
        (f,) = findings
        assert (f.first_step, f.last_step, f.evidence["steps_flagged"]) == (12, 16, 5)
        assert (f.evidence["median_ratio"], f.evidence["bound"]) == (0.5, 0.1)


def test_steps_before_start_are_not_judged():
    rows = [[0.5, 1e-3]] * 14 + [[1e-3, 1e-3]] * 5
    assert UpdateRatioRange().check(_window(rows)) == []  # steps 10-13: only 4
    (f,) = UpdateRatioRange(start=0).check(_window(rows))
    assert (f.first_step, f.last_step) == (0, 13)
    (f,) = UpdateRatioRange().check(_window(rows[:6], start=100))  # steps count, not entries
    assert f.first_step == 100


def test_biases_are_judged_only_with_min_ndim_0_or_without_shapes():
    rows = [[1e-3, 0.5]] * 20
    assert UpdateRatioRange().check(_window(rows)) == []
    assert [f.evidence["parameter"] for f in UpdateRatioRange(min_ndim=0).check(_window(rows))] == [
        "b"
    ]
    no_shapes = {"params": [{"name": "w"}, {"name": "b"}]}
    (f,) = UpdateRatioRange().check(_window(rows, header=no_shapes))
    assert f.id == "update_ratio_range/high/b@10"


def test_each_layer_and_side_is_a_finding_of_its_own():
    rows = [[0.5, 0.5]] * 20 + [[1e-7, 1e-3]] * 6
    found = UpdateRatioRange(min_ndim=0).check(_window(rows))
    assert sorted(f.id for f in found) == [
        "update_ratio_range/high/b@10",
        "update_ratio_range/high/w@10",
        "update_ratio_range/low/w@20",
    ]
    low = next(f for f in found if f.evidence["side"] == "low")
    assert "it barely learns" in low.message and low.advice == {"learning_rate": "up"}


def test_a_layer_not_updated_at_all_advises_no_learning_rate():
    (f,) = UpdateRatioRange().check(_window([[0.0, 1e-3]] * 20))
    assert "it is not updated at all" in f.message and f.advice == {}
    assert "not frozen" in f.suggestion


def test_non_finite_ratios_are_not_out_of_range():
    # a parameter at 0 (a bias initialised to zero) has ratio inf when it moves, nan when not
    rows = [[math.inf, 1e-3], [math.nan, 1e-3]] * 10
    assert UpdateRatioRange(start=0).check(_window(rows)) == []


def test_without_update_ratio_the_rule_does_not_apply():
    window = Window({s: {"loss": 1.0} for s in range(20)})
    assert not UpdateRatioRange().applies(window)
    assert UpdateRatioRange().check(window) == []
    assert UpdateRatioRange().check(Window({})) == []


def test_the_bounds_must_be_ordered():
    with pytest.raises(ValidationError, match="low"):
        UpdateRatioRange(low=0.1, high=0.01)
