"""gsnr_collapse: once an offset is fitted, only noise is left in the gradient."""

import numpy as np
import pytest
from cockpit_diagnoses import GSNRCollapse

from cockpit_core.diagnosis import Window


def test_fitting_an_offset_to_noise_collapses_the_gsnr_within_20_steps(run):
    # targets 10 + N(0, 1), independent of the inputs: the first steps follow the offset
    # (a strong common signal), afterwards the per-sample gradients only disagree
    out = run(["mean_gsnr"], steps=40, lr=0.02, task="noise", target_offset=10.0)
    (f,) = GSNRCollapse().check(Window(out))
    assert f.first_step <= 20 and f.last_step >= 35 and f.severity == "info"
    steps = np.array(sorted(out))
    gsnr = np.array([out[s]["mean_gsnr"]["total"] for s in steps])
    reference = np.median(gsnr[:5])
    median = np.median(gsnr[(steps >= f.first_step) & (steps <= f.last_step)])
    assert f.evidence["reference"] == pytest.approx(reference, rel=1e-12)
    assert f.evidence["median_gsnr"] == pytest.approx(median, rel=1e-12)
    assert f.evidence["relative"] < 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_healthy_run_keeps_its_gsnr(run, seed):
    out = run(["mean_gsnr"], steps=30, lr=0.3, seed=seed)
    assert GSNRCollapse().check(Window(out)) == []
