"""param_norm against torch.linalg.vector_norm of each parameter (float64, fixed seeds)."""

import numpy as np
import pytest
import torch
from cockpit_health import ParamNorm

from cockpit_core.testing import run_cockpit, tiny_cnn, tiny_mlp


@pytest.mark.parametrize("make", [tiny_mlp, tiny_cnn], ids=["mlp", "cnn"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_param_norm_is_the_norm_of_the_parameters_during_the_step(make, optimizer):
    result = run_cockpit(make(), [ParamNorm()], steps=4, optimizer=optimizer, on_error="raise")
    for snap in result.snapshots:
        value = result.output[snap.step]["param_norm"]
        expected = [float(torch.linalg.vector_norm(p)) for p in snap.params]
        np.testing.assert_allclose(value["per_param"], expected, rtol=1e-12)
        flat = torch.cat([p.flatten() for p in snap.params])
        assert value["total"] == pytest.approx(float(flat.pow(2).sum().sqrt()), rel=1e-12)
        assert isinstance(value["total"], float)
        assert value["per_param"].dtype == np.float64
        assert len(value["per_param"]) == len(snap.params)


def test_param_norm_of_float32_parameters_keeps_float32_precision():
    torch.manual_seed(0)
    model = torch.nn.Linear(1000, 100)  # float32, 100k entries
    with torch.no_grad():
        model.weight.add_(10.0)  # large values: naive float32 accumulation would lose digits
    from cockpit_core import Cockpit

    cp = Cockpit(model.named_parameters(), ["param_norm"], on_error="raise")
    loss = model(torch.randn(4, 1000)).square().mean()
    with cp(0, info={"loss": loss, "batch_size": 4}):
        loss.backward()
    value = cp.get_output()[0]["param_norm"]
    expected = [float(p.detach().double().pow(2).sum().sqrt()) for p in model.parameters()]
    # reduced in float32 by torch's blocked reductions: ~5e-7 here; a running float32 sum
    # of 1e5 squares of ~10 could be off by up to ~1e-3 (n * eps / 2)
    np.testing.assert_allclose(value["per_param"], expected, rtol=5e-6)
