"""nonfinite (from skipped steps) and loss_plateau."""

import math

import numpy as np
import pytest
import torch
from cockpit_diagnoses import LossPlateau, NonFinite
from cockpit_diagnoses.loss_plateau import trend_ends

from cockpit_core.diagnosis import Window
from cockpit_core.log import read_run


def _first_nonfinite_step(kit, lr, seed, batch=32, steps=200):
    """The same training without cockpit: the first step with a non-finite loss."""
    x, y = kit.make_data(seed, "regress")
    model = kit.make_model(seed, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        opt.zero_grad()
        loss = kit.per_sample_losses("regress", model(x[idx]), y[idx]).mean()
        if not math.isfinite(loss.item()):
            return step
        loss.backward()
        opt.step()
    return None


def test_divergence_to_inf_is_an_error_at_its_first_step(run, kit, tmp_path):
    log = tmp_path / "log.jsonl"
    run(["loss"], steps=80, lr=1.0, task="regress", log=log)
    data = read_run(log)
    (f,) = NonFinite().check(Window(data.output, data.skipped, data.header))
    assert f.severity == "error"
    assert f.first_step == _first_nonfinite_step(kit, 1.0, 0)
    assert f.evidence["skipped_steps"] == 80 - f.first_step


def test_a_finite_run_has_no_nonfinite_finding(run, tmp_path):
    log = tmp_path / "log.jsonl"
    run(["loss"], steps=20, lr=0.3, log=log)
    data = read_run(log)
    assert not NonFinite().applies(Window(data.output, data.skipped))
    assert NonFinite().check(Window(data.output, data.skipped)) == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_tiny_learning_rate_plateaus_within_60_steps(run, seed):
    out = run(["loss"], steps=60, lr=1e-4, batch=128, seed=seed)
    found = LossPlateau().check(Window(out))
    assert found and found[0].first_step == 0 and found[0].evidence["relative_decrease"] < 0.05


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_learning_run_has_no_plateau(run, seed):
    assert LossPlateau().check(Window(run(["loss"], steps=60, lr=0.3, batch=128, seed=seed))) == []


@pytest.mark.parametrize("offset", [0, 10**6])
def test_trend_ends_equal_a_least_squares_fit_per_window(offset):
    rng = np.random.default_rng(0)
    x = offset + np.cumsum(rng.integers(1, 4, size=40)).astype(np.float64)
    y = rng.normal(size=40)
    start, end = trend_ends(x, y, 7)
    for i in range(len(x) - 6):
        slope, intercept = np.polyfit(x[i : i + 7] - x[i], y[i : i + 7], 1)
        assert start[i] == pytest.approx(intercept, rel=1e-9, abs=1e-12)
        assert end[i] == pytest.approx(slope * (x[i + 6] - x[i]) + intercept, rel=1e-9, abs=1e-12)
