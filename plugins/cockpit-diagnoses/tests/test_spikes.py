"""loss_spike and grad_norm_spike: a one-step learning-rate spike, attributed to its layer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cockpit_diagnoses import GradNormSpike, LossSpike, UpdateRatioRange
from cockpit_diagnoses._spike import MAD_TO_STD, trailing_stats
from pydantic import ValidationError

from cockpit_core.diagnosis import Window
from cockpit_core.log import read_records
from cockpit_core.plugin.registry import default_registry

HEALTH = "update_ratio" in default_registry().quantities
"""Whether cockpit-health (the ``update_ratio`` quantity) is installed."""
needs_health = pytest.mark.skipif(not HEALTH, reason="needs cockpit-health (update_ratio)")

SPIKE = (60, {"0.weight": 100.0})
"""lr x100 for the first layer's weight only, for the update of step 60 (of 100)."""


def _trailing_factor(out, key, step, k, window=50):
    """Parameter ``k``'s ``key`` at ``step`` over its median at the ``window`` steps before."""
    steps = sorted(s for s in out if key in out[s])
    i = steps.index(step)
    past = [float(out[s][key]["per_param"][k]) for s in steps[max(0, i - window) : i]]
    return float(out[step][key]["per_param"][k]) / float(np.median(past))


def _robust_z(out, step, window=50):
    steps = sorted(s for s in out if "loss" in out[s])
    i = steps.index(step)
    past = np.array([out[s]["loss"] for s in steps[max(0, i - window) : i]])
    median = np.median(past)
    return (out[step]["loss"] - median) / (MAD_TO_STD * np.median(np.abs(past - median)))


def test_a_one_step_lr_spike_is_a_loss_spike_at_the_next_step_named_by_grad_norm(layers):
    out, header = layers(["loss", "grad_norm"], steps=100, lr=0.3, spike=SPIKE)
    window = Window(out, header=header)
    (f,) = LossSpike().check(window)
    # the update of step 60 moved the parameters; the loss of step 61 is measured there
    assert (f.id, f.severity, f.first_step) == ("loss_spike@61", "warning", 61)
    assert f.evidence["z_score"] == pytest.approx(_robust_z(out, 61), rel=1e-9)
    assert f.evidence["z_score"] > 6 and f.evidence["loss"] > 1.1 * f.evidence["window_max"]
    assert f.evidence["batch_id"] == 1061 and "step 61 (batch_id 1061)" in f.message
    assert "update_ratio_jumps" not in f.evidence  # not tracked: nothing said about it
    jumps = f.evidence["grad_norm_jumps"]
    names = [n for n, _ in header_params(header)]
    assert 1 <= len(jumps) <= 3 and [j["factor"] for j in jumps] == sorted(
        (j["factor"] for j in jumps), reverse=True
    )
    for j in jumps:
        k = names.index(j["parameter"])
        assert j["factor"] == pytest.approx(_trailing_factor(out, "grad_norm", 61, k), rel=1e-3)
    assert f.advice == {"learning_rate": "down"}
    (g,) = GradNormSpike().check(window)
    assert (g.id, g.severity, g.first_step) == ("grad_norm_spike@61", "info", 61)
    assert g.evidence["grad_norm_jumps"] == jumps


@needs_health
def test_the_update_ratio_names_the_layer_whose_learning_rate_spiked(layers):
    out, header = layers(["loss", "grad_norm", "update_ratio"], steps=100, lr=0.3, spike=SPIKE)
    window = Window(out, header=header)
    for diagnosis in (LossSpike(), GradNormSpike()):
        (f,) = diagnosis.check(window)
        assert f.first_step == 61
        top = f.evidence["update_ratio_jumps"][0]
        # the update into step 61 (under step 60) of 0.weight is 100x its usual size
        assert (top["parameter"], top["step"]) == ("0.weight", 60)
        assert top["factor"] == pytest.approx(
            _trailing_factor(out, "update_ratio", 60, 0), rel=1e-3
        )
        assert 50 < top["factor"] < 200
        others = f.evidence["update_ratio_jumps"][1:]
        assert all(j["factor"] < top["factor"] / 5 for j in others)
        assert "jumped most: update ratio of 0.weight " in f.message
    assert UpdateRatioRange().check(window) == []  # one step out of range is no stretch


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_runs_have_no_spike_and_no_update_ratio_out_of_range(layers, seed):
    quantities = ["loss", "grad_norm"] + (["update_ratio"] if HEALTH else [])
    out, header = layers(quantities, steps=100, lr=0.3, seed=seed)
    window = Window(out, header=header)
    assert LossSpike().check(window) == []
    assert GradNormSpike().check(window) == []
    assert UpdateRatioRange().check(window) == []


def test_while_training_the_spike_is_a_finding_record(layers, tmp_path):
    log = tmp_path / "log.jsonl"
    layers(["loss", "grad_norm"], steps=70, lr=0.3, spike=SPIKE, log=log, diagnoses=["loss_spike"])
    found = [r for r in read_records(log) if r["kind"] == "finding"]
    assert found and {r["id"] for r in found} == {"loss_spike@61"}
    # the rule reads grad_norm too, so the online window keeps it for the attribution
    assert found[-1]["evidence"]["grad_norm_jumps"]


def header_params(header):
    return [(p["name"], p["shape"]) for p in header["params"]]


# -- synthetic windows ---------------------------------------------------------------------

BASE = [0.5, 1.5] * 40
"""A loss alternating 0.5, 1.5: median 1, MAD 0.5, largest value 1.5 in every window."""
SCALE = MAD_TO_STD * 0.5


def _window(values, **extra):
    return Window({s: {"loss": v, **extra.get(s, {})} for s, v in enumerate(values)})


@pytest.mark.parametrize(("z", "found"), [(6.0 * (1 - 1e-9), False), (6.0 * (1 + 1e-9), True)])
def test_the_z_score_threshold_is_a_strict_bound(z, found):
    values = BASE[:60] + [1.0 + z * SCALE] + BASE[:10]
    spikes = LossSpike().check(_window(values))
    assert bool(spikes) == found
    if found:
        (f,) = spikes
        assert f.first_step == 60 and f.evidence["z_score"] == pytest.approx(z)
        assert (f.evidence["median"], f.evidence["window_max"]) == (1.0, 1.5)
        assert f.evidence["robust_std"] == pytest.approx(SCALE)
    assert bool(LossSpike(threshold=z * 0.99).check(_window(values))) is True


def test_the_value_must_clear_the_windows_largest_by_the_margin():
    # an early high loss (step 3, before steps are judged) stays in the window: median 1.005,
    # largest 3; a spike must clear 3 + 2 x (3 - 1.005) = 6.99, however large its z-score
    values = [1.0, 1.01] * 10
    values[3] = 3.0
    for high, found in ((6.9, False), (7.1, True)):
        spikes = LossSpike().check(_window([*values, high, 1.0, 1.01]))
        assert bool(spikes) is found
        assert not found or spikes[0].evidence["window_max"] == 3.0
    assert LossSpike(margin=0.0).check(_window([*values, 3.2]))
    assert not LossSpike(margin=0.0).check(_window([*values, 2.9]))


@pytest.mark.parametrize(("before", "found"), [(19, False), (20, True)])
def test_too_short_a_window_gives_no_finding(before, found):
    values = BASE[:before] + [50.0]
    assert bool(LossSpike().check(_window(values))) is found
    assert bool(LossSpike(min_window=before).check(_window(values)))


def test_non_finite_losses_are_left_to_nonfinite():
    values = [*BASE[:40], math.nan, math.inf, *BASE[:10], None, "x"]
    assert LossSpike().check(_window(values)) == []
    # the steps around them are judged as usual: a finite spike after them is found
    (f,) = LossSpike().check(_window([*values, 50.0]))
    assert f.first_step == len(values) and f.evidence["trailing_steps"] == 50


def test_a_spike_lasts_until_the_loss_is_back_at_its_median_and_a_smaller_one_follows():
    values = BASE[:40] + [20.0, 8.0, 12.0, 1.2] + BASE[:6] + [15.0] + BASE[:10]
    first, second = LossSpike().check(_window(values))
    # 41-43 are above the median before the spike (1): the same spike, until 44 (0.5)
    assert (first.first_step, first.last_step) == (40, 43)
    assert (first.evidence["peak_step"], first.evidence["peak_loss"]) == (40, 20.0)
    # 20, 8, 12 and 1.2 are left out of the largest value, so 15 is still a spike
    assert (second.first_step, second.last_step, second.evidence["window_max"]) == (50, 50, 1.5)


def test_a_constant_window_reports_a_rise_above_it():
    (f,) = LossSpike().check(_window([2.0] * 30 + [2.1]))
    assert f.evidence["z_score"] is None and f.evidence["robust_std"] == 0.0
    assert "above the constant 2 of the 30 tracked steps before" in f.message
    assert LossSpike().check(_window([2.0] * 31)) == []


def test_the_attribution_of_a_synthetic_spike():
    n = 40
    rng = np.random.default_rng(0)
    out = {}
    for s in range(n):
        grads = 1.0 + 0.1 * rng.random(3)
        ratios = 1e-3 * (1.0 + 0.1 * rng.random(3))
        if s == 30:
            grads[1] *= 50.0  # "b" gets a gradient 50x its usual one at the spike
        if s == 29:
            ratios[2] *= 20.0  # "c" moved 20x its usual share into the spike
        out[s] = {
            "loss": float(BASE[s]) if s != 30 else 30.0,
            "grad_norm": {"total": float(np.linalg.norm(grads)), "per_param": grads.tolist()},
            "update_ratio": {"total": 1e-3, "per_param": ratios.tolist()},
        }
    out[30]["metrics"] = {"batch": 7, "epoch_count": 1}
    window = Window(out, header={"params": [{"name": n} for n in "abc"]})
    (f,) = LossSpike(layers=2).check(window)
    grad, ratio = f.evidence["grad_norm_jumps"], f.evidence["update_ratio_jumps"]
    assert 1 <= len(grad) <= 2 and 1 <= len(ratio) <= 2
    assert grad[0]["parameter"] == "b" and grad[0]["factor"] == pytest.approx(50, rel=0.15)
    assert (ratio[0]["parameter"], ratio[0]["step"]) == ("c", 29)
    assert ratio[0]["factor"] == pytest.approx(20, rel=0.15)
    assert f.evidence["batch"] == 7 and "step 30 (batch 7)" in f.message
    assert "jumped most: update ratio of c 2" in f.message and "gradient norm of b " in f.message
    (g,) = GradNormSpike().check(window)  # the total norm spikes with "b"
    assert g.first_step == 30 and g.evidence["grad_norm_jumps"][0]["parameter"] == "b"
    (none,) = LossSpike(layers=0).check(window)
    assert none.evidence["grad_norm_jumps"] == [] and "jumped most" not in none.message


def test_the_spike_rules_need_their_own_quantity_and_valid_options():
    grads_only = Window({s: {"grad_norm": {"total": 1.0}} for s in range(5)})
    assert not LossSpike().applies(grads_only) and GradNormSpike().applies(grads_only)
    loss_only = _window(BASE[:5])
    assert LossSpike().applies(loss_only) and not GradNormSpike().applies(loss_only)
    with pytest.raises(ValidationError, match="min_window"):
        LossSpike(window=10, min_window=20)
    with pytest.raises(ValidationError, match="extra"):
        LossSpike(thresold=3)


def test_trailing_stats_equal_the_median_and_mad_of_each_window():
    rng = np.random.default_rng(0)
    values = rng.standard_cauchy(5000)  # heavy tails: medians, not means
    median, scale, z = trailing_stats(values, 50, 20)
    assert np.isnan(median[:20]).all() and np.isnan(z[:20]).all()
    for i in [20, 21, 49, 50, 51, 4095, 4146, 4147, 4999]:
        past = values[max(0, i - 50) : i]
        mid = np.median(past)
        assert median[i] == mid
        assert scale[i] == pytest.approx(MAD_TO_STD * np.median(np.abs(past - mid)), rel=1e-12)
        assert z[i] == pytest.approx((values[i] - mid) / scale[i], rel=1e-12)
