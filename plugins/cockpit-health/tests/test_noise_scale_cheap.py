"""noise_scale_cheap against explicit micro-batch gradients and a known truth (float64).

The reference takes each micro-batch's gradient with ``torch.autograd.grad`` of its own
mean loss and evaluates the centred definition ``S = sum_m b_m |g_m - g|^2 / (M - 1)``;
the quantity uses the expanded form from the norms the core records during the user's
backward passes, so agreement checks the algebra, the weights and the hooks. Float64 sums
of a few hundred terms differ by ~1e-15 relative; the subtraction in ``S`` amplifies that
by ``N |g|^2 / ((M - 1) S)``, below 1e3 here: rtol 1e-9.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from cockpit_health import NoiseScale, NoiseScaleCheap

from cockpit_core import Cockpit, CockpitWarning

RTOL = 1e-9


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)
    ).double()


def batches(step: int, n: int):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(n, 2, generator=gen, dtype=torch.float64) + 1.0  # a signal to detect
    return x, y


def accumulate(cp, step, model, x, y, sizes, loss_fn):
    """One step over micro-batches of ``sizes``, each loss scaled by its share."""
    total = sum(sizes)
    with cp(step, info={"batch_size": total}, accumulate=True) as run:
        lo = 0
        for b in sizes:
            loss = loss_fn(model(x[lo : lo + b]), y[lo : lo + b]) * (b / total)
            with run.micro_batch({"batch_size": b}):
                loss.backward()
            lo += b


def reference(model, x, y, sizes, loss_fn) -> dict:
    """The definitions, from each micro-batch's own gradient (autograd per micro-batch)."""
    params = list(model.parameters())
    rows, lo = [], 0
    for b in sizes:
        grads = torch.autograd.grad(loss_fn(model(x[lo : lo + b]), y[lo : lo + b]), params)
        rows.append(torch.cat([g.flatten() for g in grads]))
        lo += b
    G = torch.stack(rows)  # [M, D]
    w = torch.tensor(sizes, dtype=torch.float64)
    n, m = sum(sizes), len(sizes)
    g = (w[:, None] * G).sum(0) / n
    trace = float((w * ((G - g) ** 2).sum(1)).sum()) / (m - 1)
    signal = float(g @ g) - trace / n
    ratio = trace / signal if signal > 0 else (math.inf if trace > 0 else math.nan)
    return {
        "b_simple": ratio,
        "trace_cov": trace,
        "grad_sq": signal,
        "batch_size": n,
        "micro_batch_size": n / m,
        "micro_batches": m,
        "reason": "",
    }


@pytest.mark.parametrize(
    "sizes", [[4, 4], [3, 5, 4], [1, 2, 6, 7], [4, 4, 4, 4]], ids=["2x4", "3+5+4", "1+2+6+7", "4x4"]
)
def test_values_equal_the_definition_from_micro_batch_gradients(sizes):
    model, loss_fn = mlp(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model.named_parameters(), [NoiseScaleCheap(ema=0.5)], on_error="raise")
    references = []
    for step in range(3):
        x, y = batches(step, sum(sizes))
        references.append(reference(model, x, y, sizes, loss_fn))
        opt.zero_grad()
        accumulate(cp, step, model, x, y, sizes, loss_fn)
        opt.step()
    trace_ema = signal_ema = 0.0
    for step, expected in enumerate(references):
        value = cp.get_output()[step]["noise_scale_cheap"]
        for key in ("batch_size", "micro_batch_size", "micro_batches", "reason"):
            assert value[key] == expected[key], key
        for key in ("trace_cov", "grad_sq", "b_simple"):
            np.testing.assert_allclose(value[key], expected[key], rtol=RTOL, err_msg=key)
        # bias-corrected moving averages with beta = 0.5, written out
        trace_ema = 0.5 * trace_ema + 0.5 * expected["trace_cov"]
        signal_ema = 0.5 * signal_ema + 0.5 * expected["grad_sq"]
        correction = 1 - 0.5 ** (step + 1)
        np.testing.assert_allclose(value["trace_cov_ema"], trace_ema / correction, rtol=RTOL)
        np.testing.assert_allclose(value["grad_sq_ema"], signal_ema / correction, rtol=RTOL)
        np.testing.assert_allclose(value["b_simple_ema"], trace_ema / signal_ema, rtol=RTOL)
    assert all(math.isfinite(cp.get_output()[s]["noise_scale_cheap"]["b_simple"]) for s in range(3))


def test_without_averages_the_output_has_no_ema_keys():
    model, loss_fn = mlp(), torch.nn.MSELoss()
    cp = Cockpit(model.named_parameters(), [NoiseScaleCheap(ema=0.0)], on_error="raise")
    x, y = batches(0, 8)
    accumulate(cp, 0, model, x, y, [4, 4], loss_fn)
    assert set(cp.get_output()[0]["noise_scale_cheap"]) == {
        "b_simple",
        "trace_cov",
        "grad_sq",
        "batch_size",
        "micro_batch_size",
        "micro_batches",
        "reason",
    }


def test_estimates_are_unbiased_against_a_known_truth_and_the_exact_estimator():
    """Per-sample gradients ``g_n = (2/d)(w - x_n)``, ``x_n ~ N(0, I)``: a known truth.

    ``l_n = |w - x_n|^2 / d`` (MSE of a bias-free ``Linear(1, d)`` on input 1), so
    ``G = (2/d) w``, ``tr(Sigma) = 4 / d`` and ``B_simple = d / |w|^2`` (here 8). Over
    many independent batches of unequal micro-batches (1, 3, 4, 8 samples) the means of
    ``trace_cov`` and ``grad_sq`` must match the truth within 3 standard errors, and the
    per-batch differences to ``noise_scale``'s exact per-sample estimates (tracked on the
    same batches) must average to zero within 3 standard errors. With the unweighted mean
    of ``|g_m|^2`` and ``B_small = N / M`` instead (Appendix A read naively with unequal
    micro-batches), ``E[S] = tr(Sigma) (N / M sum_m 1 / b_m - 1) / (M - 1)``, 1.94 times
    the truth here: the test would fail.
    """
    d, sizes, steps, true_b = 10, [1, 3, 4, 8], 600, 8.0
    n = sum(sizes)
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(1, d, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1 / math.sqrt(true_b))  # |w|^2 = d / true_b
    w = model.weight[:, 0].detach()
    true_trace = 4.0 / d
    true_signal = float(((2 / d) * w).pow(2).sum())
    assert true_trace / true_signal == pytest.approx(true_b)
    loss_fn = torch.nn.MSELoss()
    cp = Cockpit(model, [NoiseScaleCheap(ema=0.0), NoiseScale()], loss_fn=loss_fn, on_error="raise")
    ones = torch.ones(n, 1, dtype=torch.float64)
    for step in range(steps):
        targets = torch.randn(n, d, generator=gen, dtype=torch.float64)
        model.zero_grad()
        accumulate(cp, step, model, ones, targets, sizes, loss_fn)
    cheap = [cp.get_output()[s]["noise_scale_cheap"] for s in range(steps)]
    exact = [cp.get_output()[s]["noise_scale"] for s in range(steps)]
    assert {(v["batch_size"], v["micro_batches"]) for v in cheap} == {(n, len(sizes))}
    for key, truth in (("trace_cov", true_trace), ("grad_sq", true_signal)):
        values = np.array([v[key] for v in cheap])
        se = values.std(ddof=1) / math.sqrt(steps)
        assert abs(values.mean() - truth) < 3 * se, key
        diff = values - np.array([v[key] for v in exact])
        assert abs(diff.mean()) < 3 * diff.std(ddof=1) / math.sqrt(steps), key
    # the naive weighting is biased by more than the test's resolution (see the docstring)
    m = len(sizes)
    naive_factor = (n / m * sum(1 / b for b in sizes) - 1) / (m - 1)
    assert naive_factor == pytest.approx(1.944, abs=1e-3)
    trace_se = np.array([v["trace_cov"] for v in cheap]).std(ddof=1) / math.sqrt(steps)
    assert abs(naive_factor - 1) * true_trace > 6 * trace_se


def test_a_training_loop_with_accumulation_records_values_and_one_micro_batch_a_reason():
    model, loss_fn = mlp(), torch.nn.MSELoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    cp = Cockpit(model.named_parameters(), ["loss", "noise_scale_cheap"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):
            x, y = batches(step, 12)
            opt.zero_grad()
            if step in (2, 3):  # no accumulation at these steps: one micro-batch
                loss = loss_fn(model(x), y)
                with cp(step, info={"batch_size": 12}, loss=loss):
                    loss.backward()
            else:
                with cp(step, info={"batch_size": 12}, accumulate=True) as run:
                    for lo in (0, 4, 8):
                        loss = loss_fn(model(x[lo : lo + 4]), y[lo : lo + 4]) / 3
                        with run.micro_batch({"batch_size": 4, "loss": loss}):
                            loss.backward()
            opt.step()
    assert cp.errors == []
    out = {s: cp.get_output()[s]["noise_scale_cheap"] for s in range(6)}
    for step in (0, 1, 4, 5):
        assert out[step]["micro_batches"] == 3 and out[step]["micro_batch_size"] == 4.0
        assert out[step]["reason"] == "" and out[step]["trace_cov"] > 0
    for step in (2, 3):
        assert out[step]["micro_batches"] == 1 and math.isnan(out[step]["b_simple"])
        assert "at least two micro-batches" in out[step]["reason"]
        # the averages keep the last defined values
        assert out[step]["trace_cov_ema"] == out[1]["trace_cov_ema"]
    assert out[4]["trace_cov_ema"] != out[1]["trace_cov_ema"]
    mine = [w for w in caught if issubclass(w.category, CockpitWarning)]
    assert [str(w.message).count("at least two micro-batches") for w in mine] == [1]
    assert all(s in cp.get_output() and "loss" in cp.get_output()[s] for s in range(6))


def test_gradients_left_from_the_last_step_are_refused():
    """Without zero_grad, p.grad holds more than the micro-batches' contributions."""
    model, loss_fn = mlp(), torch.nn.MSELoss()
    cp = Cockpit(model.named_parameters(), [NoiseScaleCheap()])
    accumulate(cp, 0, model, *batches(0, 8), [4, 4], loss_fn)
    with pytest.warns(CockpitWarning, match="zero the gradients"):
        accumulate(cp, 1, model, *batches(1, 8), [4, 4], loss_fn)
    assert "noise_scale_cheap" in cp.get_output()[0]
    assert 1 not in cp.get_output()
    (error,) = cp.errors
    assert error["step"] == 1 and "zero the gradients" in error["error"]


def test_the_averages_survive_a_checkpoint():
    model, loss_fn = mlp(), torch.nn.MSELoss()
    data = [batches(step, 8) for step in range(4)]

    def run(cp, steps):
        for step in steps:
            model.zero_grad()
            accumulate(cp, step, model, *data[step], [4, 4], loss_fn)

    whole = Cockpit(model.named_parameters(), [NoiseScaleCheap()], on_error="raise")
    run(whole, range(4))
    first = Cockpit(model.named_parameters(), [NoiseScaleCheap()], on_error="raise")
    run(first, range(2))
    resumed = Cockpit(model.named_parameters(), [NoiseScaleCheap()], on_error="raise")
    resumed.load_state_dict(first.state_dict())
    run(resumed, range(2, 4))
    expected = whole.get_output()[3]["noise_scale_cheap"]["b_simple_ema"]
    assert resumed.get_output()[3]["noise_scale_cheap"]["b_simple_ema"] == pytest.approx(
        expected, rel=1e-12
    )
    fresh = Cockpit(model.named_parameters(), [NoiseScaleCheap()], on_error="raise")
    run(fresh, range(2, 4))
    assert fresh.get_output()[3]["noise_scale_cheap"]["b_simple_ema"] != pytest.approx(
        expected, rel=1e-6
    )
