"""cockpit-basic quantities against their definitions (float64, brute force)."""

import time

import numpy as np
import pytest
import torch
from cockpit_basic import Distance, GradNorm, Loss, Parameters, Time, UpdateSize

from cockpit_core.testing import check_quantity, run_cockpit, tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients

ALL = [Loss, Parameters, Distance, UpdateSize, GradNorm, Time]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_protocol(cls):
    check_quantity(cls)


def norm(ts):
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in ts)))


@pytest.fixture(scope="module", params=[("mlp", "sgd"), ("cnn", "adam")], ids=str)
def run(request):
    problem = tiny_mlp() if request.param[0] == "mlp" else tiny_cnn()
    return run_cockpit(problem, [cls() for cls in ALL], steps=4, optimizer=request.param[1])


def test_loss_is_the_mean_of_the_per_sample_losses(run):
    for snap in run.snapshots:
        model = run.model_at(snap.step)
        expected = run.problem.individual_losses(model(snap.x), snap.y).mean().item()
        assert run.output[snap.step]["loss"] == pytest.approx(expected, rel=1e-12)


def test_grad_norm_is_the_norm_of_the_mean_per_sample_gradient(run):
    for snap in run.snapshots:
        g = per_sample_gradients(run.model_at(snap.step), run.problem, snap.x, snap.y)
        mean = [gi.mean(0) for gi in g]
        value = run.output[snap.step]["grad_norm"]
        assert value["total"] == pytest.approx(norm(mean), rel=1e-10)
        np.testing.assert_allclose(value["per_param"], [norm([m]) for m in mean], rtol=1e-10)


def test_parameters_are_numpy_copies_of_the_values_during_the_step(run):
    for snap in run.snapshots:
        values = run.output[snap.step]["parameters"]
        assert all(isinstance(v, np.ndarray) for v in values)
        for v, p in zip(values, snap.params):
            np.testing.assert_array_equal(v, p.numpy())


def test_distance_is_measured_from_the_first_tracked_step(run):
    first = run.snapshots[0].params
    for snap in run.snapshots:
        value = run.output[snap.step]["distance"]
        diff = [p - p0 for p, p0 in zip(snap.params, first)]
        assert value["total"] == pytest.approx(norm(diff), rel=1e-12, abs=1e-15)
        np.testing.assert_allclose(value["per_param"], [norm([d]) for d in diff], rtol=1e-12)


def test_distance_starts_wherever_tracking_starts():
    result = run_cockpit(tiny_mlp(), [Distance(offset=2)], steps=4)
    assert sorted(result.output) == [2, 3]
    assert result.output[2]["distance"]["total"] == 0.0
    expected = norm([a - b for a, b in zip(result.snapshots[3].params, result.snapshots[2].params)])
    assert result.output[3]["distance"]["total"] == pytest.approx(expected, rel=1e-12)


def test_update_size_is_the_parameter_change_stored_under_the_start_step(run):
    for snap in run.snapshots[:-1]:
        value = run.output[snap.step]["update_size"]
        diff = [a - b for a, b in zip(snap.params_after, snap.params)]
        assert value["total"] == pytest.approx(norm(diff), rel=1e-12)
        np.testing.assert_allclose(value["per_param"], [norm([d]) for d in diff], rtol=1e-12)
    assert "update_size" not in run.output[run.snapshots[-1].step]  # its end step never came


def test_update_size_with_plain_sgd_is_lr_times_grad_norm():
    result = run_cockpit(tiny_mlp(), [UpdateSize(), GradNorm()], steps=3, optimizer="sgd")
    for step in range(2):
        out = result.output[step]
        lr = result.snapshots[step].lr[0]
        assert out["update_size"]["total"] == pytest.approx(
            lr * out["grad_norm"]["total"], rel=1e-10
        )


def test_time_is_wall_clock_and_increasing(run):
    times = [run.output[s.step]["time"] for s in run.snapshots]
    assert times == sorted(times)
    assert abs(times[-1] - time.time()) < 600
