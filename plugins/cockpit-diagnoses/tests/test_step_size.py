"""step_size: a learning rate far too high overshoots (alpha > 0), far too low undershoots."""

import numpy as np
import pytest
from cockpit_diagnoses import StepSize

from cockpit_core.diagnosis import Window

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
def test_lr_far_too_high_overshoots_within_20_steps(run, seed):
    out = run(["alpha"], steps=30, lr=10.0, seed=seed)
    found = StepSize().check(Window(out))
    over = [f for f in found if f.id.startswith("step_size/overshoot@")]
    assert over and over[0].first_step <= 20 and over[0].severity == "warning"
    # the evidence is the logged alpha of the stretch, recomputed here
    f = over[0]
    alpha = np.array([out[s]["alpha"]["alpha"] for s in out if f.first_step <= s <= f.last_step])
    assert f.evidence["median_alpha"] == pytest.approx(float(np.median(alpha)), rel=1e-12)
    assert f.evidence["share_beyond"] == pytest.approx(float((alpha > 0).mean()), rel=1e-12)
    assert f.evidence["share_beyond"] > 0.5


@pytest.mark.parametrize("seed", SEEDS)
def test_lr_far_too_low_undershoots_within_20_steps(run, seed):
    found = StepSize().check(Window(run(["alpha"], steps=30, lr=1e-3, seed=seed)))
    under = [f for f in found if "undershoot" in f.id]
    assert under and under[0].first_step <= 20
    assert not [f for f in found if "overshoot" in f.id]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_healthy_learning_rate_gives_no_step_size_finding(run, seed):
    assert StepSize().check(Window(run(["alpha"], steps=30, lr=0.3, seed=seed))) == []


def test_thresholds_are_options():
    out = {s: {"alpha": {"alpha": 0.3}} for s in range(10)}
    assert [f.id for f in StepSize().check(Window(out))] == ["step_size/overshoot@0"]
    assert StepSize(overshoot=0.5).check(Window(out)) == []
    with pytest.raises(ValueError, match="windw"):
        StepSize(windw=3)
