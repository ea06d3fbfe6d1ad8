"""Tracking all six quantities at once gives the same values as tracking each alone."""

from __future__ import annotations

import numpy as np

from cockpit_core.testing import run_cockpit, tiny_cnn

NAMES = ["norm_test", "inner_test", "ortho_test", "mean_gsnr", "early_stopping", "cabs"]
STEPS = 50
# Each statistic is computed from the same per-sample gradients by the same code whether or
# not other statistics are requested, so the values agree to the last bit in practice;
# rtol 1e-12 only leaves room for a backend that reorders a float64 sum.
RTOL = 1e-12


def test_all_at_once_equals_each_alone():
    together = run_cockpit(tiny_cnn(), NAMES, steps=STEPS, on_error="raise").output
    assert sorted(together) == list(range(STEPS))
    for name in NAMES:
        alone = run_cockpit(tiny_cnn(), [name], steps=STEPS, on_error="raise").output
        assert sorted(alone) == list(range(STEPS))
        for step in range(STEPS):
            a, b = together[step][name], alone[step][name]
            np.testing.assert_allclose(a["total"], b["total"], rtol=RTOL, atol=0)
            np.testing.assert_allclose(a["per_param"], b["per_param"], rtol=RTOL, atol=0)
