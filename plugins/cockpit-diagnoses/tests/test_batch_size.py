"""batch_size: a tiny batch fails the gradient tests persistently; a large one passes."""

import numpy as np
import pytest
from cockpit_diagnoses import BatchSize

from cockpit_core.diagnosis import Window

TESTS = ["norm_test", "inner_test", "ortho_test"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_tiny_batch_fails_the_norm_test_within_20_steps(run, seed):
    out = run(TESTS, steps=30, lr=0.3, batch=4, seed=seed)
    found = [f for f in BatchSize().check(Window(out)) if f.id.startswith("batch_size/norm")]
    assert found and found[0].first_step <= 20
    f = found[0]
    theta = np.array(
        [out[s]["norm_test"]["total"] for s in out if f.first_step <= s <= f.last_step]
    )
    median = float(np.median(theta))
    assert f.evidence["median_theta_max"] == pytest.approx(median, rel=1e-12)
    # Byrd et al. (2012): the test passes at B' = B (theta_max / theta)^2
    assert f.evidence["batch_factor"] == pytest.approx((median / 0.8) ** 2, rel=1e-12)
    assert f.evidence["batch_factor"] > 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_large_batch_gives_no_batch_size_finding(run, seed):
    out = run(TESTS, steps=30, lr=0.3, batch=128, seed=seed)
    assert BatchSize().check(Window(out)) == []


def test_cabs_suggestion_is_evidence_when_tracked():
    out = {s: {"norm_test": {"total": 2.0}, "cabs": {"total": 64.0 + s}} for s in range(10)}
    (f,) = BatchSize().check(Window(out))
    assert f.evidence["cabs_batch_size"] == 68.5  # median of 64..73
    assert f.evidence["batch_factor"] == pytest.approx((2.0 / 0.8) ** 2)
