"""The quantity: protocol checks and its value against a brute-force definition."""

import pytest
import torch
from cockpit_core.testing import check_quantity, run_cockpit, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients

from cockpit_example import MaxSampleGradNorm


@pytest.mark.parametrize("options", [{}, {"relative": True}])
def test_protocol(options):
    check_quantity(MaxSampleGradNorm, options=options)


@pytest.mark.parametrize("relative", [False, True])
def test_value_equals_brute_force(relative):
    # tiny_mlp is float64; per_sample_gradients is one autograd call per sample, so the two
    # agree up to rounding of sums of ~100 products (~1e-14): rel=1e-10 leaves a wide margin
    result = run_cockpit(tiny_mlp(), [MaxSampleGradNorm(relative=relative)], steps=3)
    for snap in result.snapshots:
        grads = per_sample_gradients(result.model_at(snap.step), result.problem, snap.x, snap.y)
        per_sample = torch.cat([g.flatten(1) for g in grads], dim=1)  # [B, D]
        expected = per_sample.norm(dim=1).max().item()
        if relative:
            expected /= per_sample.mean(0).norm().item()
        got = result.output[snap.step]["max_sample_grad_norm"]
        assert got == pytest.approx(expected, rel=1e-10)
