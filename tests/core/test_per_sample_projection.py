"""per_sample_projection: g_n . V_k(g) on directions from the final gradient, after backward."""

from __future__ import annotations

import warnings

import torch

from cockpit_core import (
    Cockpit,
    Quantity,
    Requirements,
    StepContext,
    per_sample_projection,
)
from cockpit_core.testing.problems import tiny_cnn
from cockpit_core.testing.reference import per_sample_gradients
from cockpit_core.testing.runner import run_cockpit


def directions(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Three directions, one of them non-linear in the gradient (like Adam's update)."""
    return torch.stack([grad, param, grad / (grad.abs() + 1e-3)])


class Probe(Quantity):
    """Records the projections (and the gradients the directions were built from)."""

    name = "probe"
    STAT = per_sample_projection("probe-directions", directions)
    REQUIREMENTS = Requirements(statistics=(STAT,))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[int, list[torch.Tensor]] = {}

    def compute(self, ctx: StepContext) -> float:
        self.seen[ctx.step] = [t.clone() for t in ctx.stat(self.STAT)]
        return 0.0


def brute_force(model, problem, x, y, grads) -> list[torch.Tensor]:
    """Loop over samples: [B, 3] per parameter."""
    per_sample = per_sample_gradients(model, problem, x, y)
    out = []
    for g_n, g, p in zip(per_sample, grads, model.parameters()):
        v = directions(g, p.detach()).reshape(3, -1)
        out.append(g_n.reshape(len(x), -1) @ v.T)
    return out


def test_projections_equal_a_loop_over_samples_on_conv_and_linear_layers():
    problem = tiny_cnn(batch_size=6)
    probe = Probe()
    result = run_cockpit(problem, [probe], steps=2, on_error="raise")
    for snap in result.snapshots:
        model = result.model_at(snap.step)
        expected = brute_force(model, problem, snap.x, snap.y, snap.grads)
        for actual, e in zip(probe.seen[snap.step], expected):
            assert actual.shape == e.shape
            torch.testing.assert_close(actual, e, rtol=1e-10, atol=1e-12)


def test_accumulated_micro_batches_are_projected_on_the_accumulated_gradient():
    problem = tiny_cnn(batch_size=6)
    whole, parts = Probe(), Probe()
    x, y = problem.batch(0)
    for probe, split in ((whole, [6]), (parts, [2, 4])):
        model = problem.make_model()
        loss_fn = problem.loss_module()
        cp = Cockpit(model.named_parameters(), [probe], on_error="raise")
        with cp(0, info={"batch_size": 6}, accumulate=True) as run:
            lo = 0
            for size in split:
                xb, yb = x[lo : lo + size], y[lo : lo + size]
                lo += size
                loss = loss_fn(model(xb), yb) * (size / 6)
                with run.micro_batch({"loss": loss, "batch_size": size}):
                    loss.backward()
    for a, e in zip(parts.seen[0], whole.seen[0]):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


def test_failing_directions_are_reported_and_training_goes_on():
    def broken(grad, param):
        raise RuntimeError("no directions today")

    class Broken(Probe):
        name = "broken"
        STAT = per_sample_projection("broken-directions", broken)
        REQUIREMENTS = Requirements(statistics=(STAT,))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_cockpit(tiny_cnn(), [Broken()], steps=2)
    assert len(result.snapshots) == 2  # both steps trained
    assert "no directions today" in result.cockpit.errors[0]["error"]
