"""A tiny problem, a plain-loop reference and helpers shared by the integration tests."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np
import pytest
import torch

from cockpit_core import Cockpit, extend

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
