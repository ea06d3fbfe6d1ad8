"""update_ratio against parameters copied before and after ``opt.step()`` (float64)."""

from collections.abc import Callable

import numpy as np
import pytest
import torch
from cockpit_health import UpdateRatio

from cockpit_core import Cockpit
from cockpit_core.testing import Problem, tiny_cnn, tiny_mlp

STEPS = 4

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
}


def train(problem: Problem, optimizer: str, steps: int = STEPS):
    """Train with ``update_ratio`` tracked; return the output and the copies around each step."""
    model = problem.make_model()
    opt = OPTIMIZERS[optimizer](model.parameters())
    cp = Cockpit(model.named_parameters(), [UpdateRatio()], on_error="raise")
    loss_fn = problem.loss_module()
    copies = []
    for step in range(steps):
        x, y = problem.batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, info={"loss": loss, "batch_size": len(x), "optimizer": opt}):
            loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        after = [p.detach().clone() for p in model.parameters()]
        copies.append((before, after))
    return cp.get_output(), copies


def norm(tensors) -> float:
    return float(torch.cat([t.flatten() for t in tensors]).pow(2).sum().sqrt())


@pytest.mark.parametrize("make", [tiny_mlp, tiny_cnn], ids=["mlp", "cnn"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_update_ratio_is_the_relative_parameter_change(make, optimizer):
    output, copies = train(make(), optimizer)
    for step, (before, after) in enumerate(copies[:-1]):
        value = output[step]["update_ratio"]
        diffs = [a - b for a, b in zip(after, before)]
        expected = [float(d.norm() / b.norm()) for d, b in zip(diffs, before)]
        np.testing.assert_allclose(value["per_param"], expected, rtol=1e-10)
        assert value["total"] == pytest.approx(norm(diffs) / norm(before), rel=1e-10)
    assert "update_ratio" not in output.get(STEPS - 1, {})  # its end step never came


def test_update_ratio_of_a_zero_parameter_is_inf_if_it_moved_and_nan_if_not():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).double()
    with torch.no_grad():
        model[0].bias.zero_()  # will move
        model[1].bias.zero_()  # frozen by lr 0
    moving = [model[0].weight, model[0].bias, model[1].weight]
    opt = torch.optim.SGD([{"params": moving}, {"params": [model[1].bias], "lr": 0.0}], lr=0.1)
    cp = Cockpit(model.named_parameters(), [UpdateRatio()], on_error="raise")
    x = torch.randn(5, 3, dtype=torch.float64)
    for step in range(2):
        opt.zero_grad()
        loss = model(x).square().mean()
        with cp(step, info={"loss": loss, "batch_size": 5}):
            loss.backward()
        opt.step()
    ratios = cp.get_output()[0]["update_ratio"]["per_param"]
    assert np.isfinite(ratios[[0, 2]]).all()
    assert ratios[1] == np.inf
    assert np.isnan(ratios[3])
    assert np.isfinite(cp.get_output()[0]["update_ratio"]["total"])


def test_bfloat16_parameters_are_subtracted_exactly():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 8).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = Cockpit(model.named_parameters(), [UpdateRatio()], on_error="raise")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    copies = []
    for step in range(2):
        opt.zero_grad()
        loss = model(x).float().square().mean()
        with cp(step, info={"loss": loss, "batch_size": 4}):
            loss.backward()
        before = [p.detach().double() for p in model.parameters()]
        opt.step()
        copies.append((before, [p.detach().double() for p in model.parameters()]))
    before, after = copies[0]
    expected = [float((a - b).norm() / b.norm()) for a, b in zip(after, before)]
    # the difference is taken in float32; norms of 512 entries reduced in float32: ~1e-7
    np.testing.assert_allclose(cp.get_output()[0]["update_ratio"]["per_param"], expected, rtol=1e-6)
