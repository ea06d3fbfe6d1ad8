"""NaN/inf loss or gradients: the step is skipped with a recorded reason, nothing crashes."""

import math

import pytest
import torch

from cockpit_core import Cockpit, CockpitWarning
from cockpit_core.engine.loop_checks import nonfinite_reason
from cockpit_core.log import read_records
from cockpit_core.testing import tiny_mlp


def train(quantities, poison, steps=4, log=None):
    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    cp = Cockpit(model.named_parameters(), quantities, log=log)
    for step in range(steps):
        x, y = problem.batch(step)
        out = model(x)
        loss = loss_fn(out, y) * poison.get(step, 1.0)
        losses = problem.individual_losses(out, y).detach()
        with cp(step, info={"loss": loss, "individual_losses": losses, "batch_size": len(x)}):
            loss.backward()
        model.zero_grad()  # no optimizer step: later steps stay finite
    cp.close()
    return cp


@pytest.mark.parametrize(
    "poison, reason", [(math.nan, "the loss is nan"), (math.inf, "the loss is inf")]
)
def test_nonfinite_loss_skips_the_step_with_a_reason(tmp_path, poison, reason):
    log = tmp_path / "log.jsonl"
    with pytest.warns(CockpitWarning, match=f"step 2 skipped because {reason}; training continues"):
        cp = train(["loss", "grad_norm", "update_size"], {2: poison}, log=log)
    out = cp.get_output()
    assert sorted(out) == [0, 1, 3] and "loss" in out[3]
    assert cp.skipped[0]["step"] == 2 and reason in cp.skipped[0]["reason"]
    assert "update_size" not in out[1]  # its end point (step 2) was not finite
    skipped = [r for r in read_records(log) if r["kind"] == "skipped"]
    assert skipped[0]["quantities"] == ["grad_norm", "loss", "update_size"]


def test_nonfinite_gradients_name_the_parameters():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["grad_norm"])
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with pytest.warns(CockpitWarning, match=r"the gradients of '0.weight' contain NaN or inf"):
        with cp(0, info={"loss": loss}):
            loss.backward()
            model[0].weight.grad[0, 0] = torch.inf
    assert cp.get_output() == {}


def test_large_finite_gradients_are_not_taken_for_nonfinite_ones():
    """A float32 gradient whose 2-norm overflows (entries ~1e30) is finite: no step is skipped."""
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(3))]
    params[0].grad = torch.full((4,), 1e30)  # ||g||^2 = 4e60 overflows float32
    params[1].grad = torch.ones(3)
    assert not math.isfinite(float(torch.linalg.vector_norm(params[0].grad)))
    assert nonfinite_reason({}, params, ["big", "small"]) is None
    params[1].grad[1] = torch.nan
    assert nonfinite_reason({}, params, ["big", "small"]) == (
        "the gradients of 'small' contain NaN or inf"
    )
