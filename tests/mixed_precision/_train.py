"""One small training run with or without a GradScaler or autocast, and a comparison."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from cockpit_backpack import extend

from cockpit_core import Cockpit

STEPS = 3
BATCH = 16
# business (economy + tic_diag + hess_trace) and hess_max_ev for Hessian-vector products
QUANTITIES = [*"alpha distance grad_hist_1d grad_norm inner_test loss norm_test".split()]
QUANTITIES += ["ortho_test", "update_size", "tic_diag", "hess_trace", "hess_max_ev"]


def make_model(activation: type[torch.nn.Module] = torch.nn.ReLU) -> torch.nn.Module:
    torch.manual_seed(0)
    return extend(torch.nn.Sequential(torch.nn.Linear(6, 8), activation(), torch.nn.Linear(8, 3)))


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 6, generator=gen), torch.randint(
        0, 3, (STEPS, BATCH), generator=gen
    )


def train(
    mode: str = "plain",
    path: str = "hooks",
    quantities: Any = QUANTITIES,
    activation: type[torch.nn.Module] = torch.nn.ReLU,
    inside: Callable[[int, torch.nn.Module, Any, Any], None] | None = None,
    pass_scaler: bool = True,
    **cockpit_options: Any,
) -> Cockpit:
    """Train 3 SGD steps; ``mode``: ``plain``, ``scaler`` (init scale 1024), ``bf16`` or
    ``fp16`` (forward passes under CPU autocast to that precision).

    ``path``: ``hooks`` (``Cockpit(model, ...)``: module hooks) or ``backpack``
    (``Cockpit(model.named_parameters(), ...)`` on the extended model). ``inside(step,
    model, scaler, optimizer)`` runs inside the ``with`` block after ``backward``.
    """
    model = make_model(activation)
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    per_sample = torch.nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = model if path == "hooks" else model.named_parameters()
    cp = Cockpit(params, quantities, on_error="warn", **cockpit_options)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if mode == "scaler" else None
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    autocast = torch.autocast("cpu", dtype=half) if half else contextlib.nullcontext()
    x, y = batches()
    for step in range(STEPS):
        opt.zero_grad()
        with autocast:
            out = model(x[step])
            loss = loss_fn(out, y[step])
            losses = per_sample(out, y[step]).detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": BATCH, "optimizer": opt}
        if scaler is not None and pass_scaler:
            info["grad_scaler"] = scaler
        with cp(step, info=info):
            backpropagated = loss if scaler is None else scaler.scale(loss)
            backpropagated.backward(retain_graph=cp.retain_graph(step))
            if inside is not None:
                inside(step, model, scaler, opt)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
    return cp


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"grad_norm.per_param": array, ...}``: every leaf of a quantity's value."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def assert_same_statistics(
    actual: Cockpit,
    expected: Cockpit,
    rtol: float,
    atol: float = 0.0,
    tolerances: dict[str, tuple[float, float]] | None = None,
) -> None:
    """Every step and quantity of ``expected`` is in ``actual`` with equal values."""
    tolerances = tolerances or {}
    assert not expected.errors, expected.errors
    assert not actual.errors, [e["error"] for e in actual.errors]
    out, ref = actual.get_output(), expected.get_output()
    assert sorted(out) == sorted(ref)
    for step, values in ref.items():
        assert set(values) == set(out[step]), f"step {step}"
        for key, value in values.items():
            got = flatten(out[step][key])
            for leaf, want in flatten(value).items():
                name = f"step {step}: {key}.{leaf}" if leaf else f"step {step}: {key}"
                if isinstance(want, (str, bool)) or want is None:
                    assert got[leaf] == want, name
                    continue
                r, a = tolerances.get(key, (rtol, atol))
                np.testing.assert_allclose(
                    np.asarray(got[leaf], dtype=float),
                    np.asarray(want, dtype=float),
                    rtol=r,
                    atol=a,
                    err_msg=name,
                )
