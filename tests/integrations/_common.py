"""A tiny problem, a plain-loop reference and helpers shared by the integration tests."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from cockpit_backpack import extend

from cockpit_core import Cockpit, Registry, hookimpl
from cockpit_core.diagnosis import Diagnosis, Finding, Window

# loss and gradient norm, two gradient tests (norm: SUM_GRAD_SQUARED, inner: projections)
# and the GSNR: every kind of first-order statistic the hosts must feed correctly
QUANTITIES = ["loss", "grad_norm", "norm_test", "inner_test", "mean_gsnr"]
LR = 1.0
CLIP = 0.1  # below the gradient norm of both steps (asserted), so clipping really acts
STEPS = 2


def import_framework(name: str) -> ModuleType:
    """Import ``name``; skip the calling test module if the framework is not installed.

    In CI (``CI`` set), where ``./dev setup`` installs the frameworks, a failing import is
    an error instead, so the tests cannot silently stop running. Outside CI an installed
    but broken framework (e.g. a torchvision that does not match torch, see
    docs/integrations.md) skips with the reason.
    """
    try:
        return importlib.import_module(name)
    except Exception as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{name} not usable here: {err!r}", allow_module_level=True)


def read_csv(path) -> dict[int, dict[str, float]]:
    """``{step: {column: value}}`` of a Lightning ``CSVLogger`` file (rows of a step merged)."""
    out: dict[int, dict[str, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            values = {k: float(v) for k, v in row.items() if k != "step" and v != ""}
            out.setdefault(int(row["step"]), {}).update(values)
    return out


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return extend(
        torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    )


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)


def reference(clip: float | None = None) -> tuple[dict, list[torch.Tensor]]:
    """The same training by hand: SGD (lr 1), the 16 samples as one batch per step.

    With ``clip``, the gradient norm is clipped *after* the Cockpit step, before
    ``optimizer.step()``, as the frameworks do. Returns the Cockpit output and the final
    parameters.
    """
    model = make_model()
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    cp = Cockpit(model.named_parameters(), QUANTITIES, on_error="raise")
    x, y = data()
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, info={"loss": loss, "batch_size": len(x), "optimizer": opt}):
            loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return cp.get_output(), [p.detach().clone() for p in model.parameters()]


def assert_outputs_equal(actual: dict, expected: dict, rtol: float = 1e-5) -> None:
    """Every step and quantity agree (float32, the same operations up to summation order)."""
    assert sorted(actual) == sorted(expected)
    for step, values in expected.items():
        assert set(values) - {"time"} <= set(actual[step]), f"step {step}"
        for key, value in values.items():
            if key == "time":
                continue
            a, e = actual[step][key], value
            if isinstance(e, dict):
                for k in e:
                    np.testing.assert_allclose(a[k], e[k], rtol=rtol, err_msg=f"{step}.{key}.{k}")
            else:
                np.testing.assert_allclose(a, e, rtol=rtol, err_msg=f"{step}.{key}")


def assert_params_equal(actual, expected, rtol: float = 1e-5) -> None:
    """The trained parameters agree: the host applied the same (clipped) updates."""
    actual = list(actual)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.detach(), e, rtol=rtol, atol=1e-7)


# -- brute force for Cockpits over part of the parameters (several optimizers) -------------


def chain_losses(params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample losses of ``Linear(6, 5), Tanh, Linear(5, 3)`` written out (no modules)."""
    w1, b1, w2, b2 = params
    logits = torch.tanh(x @ w1.T + b1) @ w2.T + b2
    return torch.nn.functional.cross_entropy(logits, y, reduction="none")


def per_sample(losses_fn, params, tracked, x, y) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample losses ``[B]`` and gradients ``[B, D]`` w.r.t. ``params[k], k in tracked``."""
    params = [p.detach().double().requires_grad_() for p in params]
    rows = []
    for n in range(len(x)):
        loss = losses_fn(params, x[n : n + 1].double(), y[n : n + 1]).sum()
        grads = torch.autograd.grad(loss, [params[k] for k in tracked])
        rows.append(torch.cat([g.flatten() for g in grads]))
    with torch.no_grad():
        losses = losses_fn(params, x.double(), y)
    return losses, torch.stack(rows)


def _alpha(start: tuple, end: tuple, d: torch.Tensor) -> float:
    """alpha (Mahsereci & Hennig, 2017) along ``d``: whitened least squares by numpy."""
    t = float(d.norm())
    (f0, g0), (f1, g1) = start, end
    s0, s1 = g0 @ (d / t), g1 @ (d / t)
    values = [float(v) for v in (f0.mean(), f1.mean(), s0.mean(), s1.mean())]
    sigma = np.sqrt([float(v.var()) for v in (f0, f1, s0, s1)])
    rows = np.array([[1, 0, 0], [1, t, t * t], [0, 1, 0], [0, 1, 2 * t]], dtype=float)
    mu = np.linalg.lstsq(rows / sigma[:, None], np.array(values) / sigma, rcond=None)[0]
    return -1.0 if mu[2] <= 0 else t / (-mu[1] / (2 * mu[2])) - 1


def brute_force(losses_fn, states: list, tracked: list[int], batches: list) -> dict:
    """What a Cockpit over ``params[k], k in tracked`` must record, from the definitions.

    ``states[s]``: every parameter during step ``s`` (one more after the last step);
    ``batches[s]``: ``(x, y)`` of step ``s``. Float64. Returns ``{step: {"loss",
    "grad_norm", "distance", "update_size", "alpha"}}`` (the last step without the two
    update-based ones: no next step ends them).
    """
    theta = [torch.cat([state[k].detach().double().flatten() for k in tracked]) for state in states]
    ends = [per_sample(losses_fn, states[s], tracked, *b) for s, b in enumerate(batches)]
    out = {}
    for s, (losses, grads) in enumerate(ends):
        values = {
            "loss": float(losses.mean()),
            "grad_norm": float(grads.mean(0).norm()),
            "distance": float((theta[s] - theta[0]).norm()),
        }
        if s + 1 < len(batches):
            d = theta[s + 1] - theta[s]
            values.update(update_size=float(d.norm()), alpha=_alpha(ends[s], ends[s + 1], d))
        out[s] = values
    return out


def assert_matches_brute_force(
    output: dict, expected: dict, rel: float = 1e-7, skip: tuple[str, ...] = ()
) -> None:
    """Each step's values equal the brute force; only those steps and values are recorded.

    ``skip``: quantities recorded but not compared (checked elsewhere).
    """
    assert sorted(output) == sorted(expected)
    for step, values in expected.items():
        got = {k: v for k, v in output[step].items() if k not in ("time", *skip)}
        assert sorted(got) == sorted(k for k in values if k not in skip), step
        for key, value in got.items():
            if isinstance(value, dict):
                assert value.get("exact", True) is True, f"{step}.{key}"
                value = value["alpha"] if key == "alpha" else value["total"]
            assert value == pytest.approx(values[key], rel=rel, abs=1e-12), f"{step}.{key}"


# -- stock models: no extend, no cockpit_info; the hosts find everything themselves ------

# loss, gradient norm, a per-sample gradient test, the GSNR and two Hessian quantities
# (Lanczos and Hutchinson: the hosts must keep the graph without a change to the model)
STOCK_QUANTITIES = [
    "loss",
    "grad_norm",
    "norm_test",
    "mean_gsnr",
    {"name": "hess_max_ev"},
    {"name": "hess_trace", "method": "hutchinson"},
]
# the scalar each of them is compared by (the keys a host's loggers receive)
STOCK_TAGS = {
    "cockpit/loss": ("loss", None),
    "cockpit/grad_norm/total": ("grad_norm", "total"),
    "cockpit/norm_test/total": ("norm_test", "total"),
    "cockpit/mean_gsnr/total": ("mean_gsnr", "total"),
    "cockpit/hess_max_ev/value": ("hess_max_ev", "value"),
    "cockpit/hess_trace/total": ("hess_trace", "total"),
}
STOCK_LR = 0.5


def plain_model(seed: int = 0) -> torch.nn.Sequential:
    """``Linear(6, 5), Tanh, Linear(5, 3)`` as a user writes it (53 parameters)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def stock_reference(steps: int = STEPS, first: int = 0) -> tuple[dict, list[list[torch.Tensor]]]:
    """A hand-written loop: SGD (lr 0.5), all 16 samples as one batch per step.

    A host that accumulates micro-batches of these 16 samples (in any order) must give
    the same values: every statistic here is of the mean loss of the 16 samples. Returns
    the Cockpit output (steps numbered from ``first``: the random probes of Hutchinson's
    estimator depend on the step number) and the parameters during each step.
    """
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=STOCK_LR)
    cp = Cockpit(model, STOCK_QUANTITIES, on_error="raise")
    x, y = data()
    states = []
    for step in range(steps):
        states.append([p.detach().clone() for p in model.parameters()])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step + first, info={"loss": loss, "batch_size": len(x), "optimizer": opt}):
            loss.backward(retain_graph=cp.retain_graph(step + first))
        opt.step()
    return cp.get_output(), states


def exact_loss_and_max_ev(params: list[torch.Tensor]) -> tuple[float, float]:
    """Float64 mean loss and largest eigenvalue of its explicit Hessian (53 x 53)."""
    x, y = data()
    shapes = [p.shape for p in params]
    flat = torch.cat([p.detach().double().flatten() for p in params])

    def loss_of(theta: torch.Tensor) -> torch.Tensor:
        parts = torch.split(theta, [s.numel() for s in shapes])
        w1, b1, w2, b2 = (t.reshape(s) for t, s in zip(parts, shapes))
        logits = torch.tanh(x.double() @ w1.T + b1) @ w2.T + b2
        return torch.nn.functional.cross_entropy(logits, y)

    hessian = torch.autograd.functional.hessian(loss_of, flat)
    return float(loss_of(flat)), float(torch.linalg.eigvalsh(hessian)[-1])


def assert_logged_match(
    logged: dict[int, dict[str, float]], rtol: float = 1e-5, first: int = 0
) -> None:
    """The host's logged scalars equal the hand-written loop's values and the brute force.

    Host and loop run the same float32 operations up to summation order (two
    micro-batches instead of one batch), so values agree to ``rtol`` 1e-5. The loss also
    equals its float64 value (1e-6) and ``hess_max_ev`` the largest eigenvalue of the
    explicit float64 Hessian (Lanczos stops at a relative error bound of 1e-4; 1e-3 leaves
    room for float32 Hessian-vector products). ``first``: the host's number of the loop's
    step 0 (Lightning 0, Hugging Face 1: its ``global_step`` after the first update).
    """
    expected, states = stock_reference(first=first)
    assert sorted(logged) == sorted(expected) == list(range(first, first + STEPS))
    for step, values in expected.items():
        got = logged[step]
        for tag, (key, field) in STOCK_TAGS.items():
            want = values[key] if field is None else values[key][field]
            assert tag in got, f"step {step}: {tag} not logged"
            np.testing.assert_allclose(got[tag], want, rtol=rtol, err_msg=f"{step} {tag}")
        loss, max_ev = exact_loss_and_max_ev(states[step - first])
        assert got["cockpit/loss"] == pytest.approx(loss, rel=1e-6)
        assert got["cockpit/hess_max_ev/value"] == pytest.approx(max_ev, rel=1e-3)


# -- the per-sample reference: one autograd call per sample loss of the step's own pass -------

PROVIDER = (
    Path(__file__).resolve().parents[2]
    / "plugins"
    / "cockpit-hooks"
    / "tests"
    / "autograd_loop_provider.py"
)


def loop_registry() -> Registry:
    """The installed plugins and the reference provider ``autograd_loop``."""
    spec = importlib.util.spec_from_file_location(
        "cockpit_test_integrations_autograd_loop", PROVIDER
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry = Registry.from_entry_points()
    info = registry.add_plugin(module, name="autograd_loop")
    assert info.ok, info.error
    return registry


def compare(actual: Any, expected: Any, path: str = "", rtol: float = 1e-6) -> None:
    """Equal structure; numbers to ``rtol``, histogram counts within 4."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for key in expected:
            compare(actual[key], expected[key], f"{path}.{key}", rtol)
    elif isinstance(expected, (list, tuple)) and not all(
        isinstance(v, (int, float)) for v in expected
    ):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, f"{path}[{i}]", rtol)
    elif isinstance(expected, str) or expected is None or isinstance(expected, bool):
        assert actual == expected, path
    else:
        a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
        if "grad_hist_1d" in path and (".hist" in path or ".per_param" in path):
            np.testing.assert_allclose(a, e, atol=4, rtol=0, err_msg=path)  # counts
        else:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-12, err_msg=path)


# -- a third-party diagnosis that fires deterministically -----------------------------


class Fires(Diagnosis):
    """Fires at every tracked step with a loss: a warning each, an error at step 1, an info at 0.

    Over ``STEPS`` = 2 steps: 2 warnings, 1 error, 1 info, each reported when its step's
    loss is recorded.
    """

    name = "fires"
    reads = ("loss",)
    source = "a test rule"

    def check(self, window: Window) -> list[Finding]:
        steps = window.steps
        out = [
            self.finding("always", "warning", s, s, "the test rule fired", {"step": s}, "A test.")
            for s in steps
        ]
        if steps:
            out.append(self.finding("first", "info", steps[0], steps[0], "first step", {}))
        if 1 in steps:
            out.append(self.finding("one", "error", 1, 1, "step one", {}, "Stop."))
        return out


FIRES_EXPECTED = {"info": 1, "warning": 2, "error": 1}  # over STEPS steps


class _FiresPlugin:
    @hookimpl
    def register_diagnoses(self, register):
        register(Fires)


def fires_registry() -> Registry:
    """The installed plugins and the test plugin registering ``fires``."""
    registry = Registry.from_entry_points()
    info = registry.add_plugin(_FiresPlugin(), name="fires_plugin")
    assert info.ok, info.error
    return registry


def severity_counts(findings: list[Finding]) -> dict[str, int]:
    """``{severity: number of findings}`` over the three severities."""
    return {s: sum(f.severity == s for f in findings) for s in ("info", "warning", "error")}
