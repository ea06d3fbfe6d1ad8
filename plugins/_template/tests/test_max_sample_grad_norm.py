"""Tests of the example plugin: protocol checks, the value against its definition, the panel."""

import pytest
import torch
from cockpit_example import MaxSampleGradNorm
from cockpit_example.instruments import INSTRUMENTS

from cockpit_core.testing import check_instrument, check_quantity, run_cockpit, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients


def test_protocol():
    check_quantity(MaxSampleGradNorm)
    check_quantity(MaxSampleGradNorm, options={"relative": True})


@pytest.mark.parametrize("relative", [False, True])
def test_value_equals_brute_force(relative):
    result = run_cockpit(tiny_mlp(), [MaxSampleGradNorm(relative=relative)], steps=3)
    for snap in result.snapshots:
        grads = per_sample_gradients(result.model_at(snap.step), result.problem, snap.x, snap.y)
        per_sample = torch.cat([g.flatten(1) for g in grads], dim=1)  # [B, D]
        expected = per_sample.norm(dim=1).max().item()
        if relative:
            expected /= per_sample.mean(0).norm().item()
        got = result.output[snap.step]["max_sample_grad_norm"]
        assert got == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("instrument", INSTRUMENTS, ids=lambda i: i.name)
def test_panel_draws(instrument):
    # draws on a short run of the quantity; warnings and exceptions fail with their message
    fig = check_instrument(instrument, quantities=[MaxSampleGradNorm])
    assert fig.axes[0].get_ylabel() == r"$\max_n \|g_n\|$"
