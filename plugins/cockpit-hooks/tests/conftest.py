"""Shared checks of the module-hook provider: real Cockpits against a per-sample autograd loop.

Every test drives a ``Cockpit(..., backend="hooks")`` (or ``"auto"``) with ``cp.attach`` and
a recording quantity, so that routing, arming, collection and reduction are exercised, and
compares each statistic with its definition computed from ``g_n = grad l_n`` by one
``torch.autograd.grad`` call per sample on an untouched copy of the model (float64).

Tolerance: ``1e-10`` relative to the size of the reference. Every value is a float64
computation of a few thousand terms at most, so rounding stays near ``1e-14``; a wrong
formula (a missed factor ``B``, a wrong row, a missing use) is off by ``O(1)``.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor

from cockpit_core import (
    BATCH_DOT,
    BATCH_L2,
    BATCH_PROJECTION,
    GRAD_BATCH,
    SUM_GRAD_SQUARED,
    Cockpit,
    EmbeddingGrads,
    OuterProductGrads,
    PerSampleGrads,
    Quantity,
    Requirements,
    Statistic,
    per_sample_projection,
    per_sample_transform,
)
from cockpit_core.errors import UnsupportedModelError
from cockpit_core.testing.providers.reference import directions, dots, relative_error
from cockpit_core.testing.providers.reference import reference_statistic as reference
from cockpit_core.testing.reference import per_sample_gradients_from_losses as per_sample_loop

TOL = 1e-10
"""Largest accepted error relative to the reference's size (see the module docstring)."""

MAX_ERRORS: dict[str, float] = {}
"""Largest relative error seen per test group (printed in the terminal summary)."""


def _cubes(grads: Tensor, param: Tensor) -> Tensor:
    """Additive over samples, as ``reduce="sum"`` requires (blocks of samples add up).

    Weighted by ``cos(theta)``, unlike the kit's
    :func:`~cockpit_core.testing.providers.reference.cubes` (``theta``).
    """
    return (grads**3).sum(0) * torch.cos(param)


def _abs_max(grads: Tensor, param: Tensor) -> Tensor:
    return grads.flatten(1).abs().amax(1)


def _dots_factored(grads: PerSampleGrads, param: Tensor) -> Tensor:
    """``g_n . theta`` for the forms with a known closed form, ``NotImplemented`` otherwise.

    Unlike the kit's :func:`~cockpit_core.testing.providers.reference.dots_factored`
    (``grads.dot`` on every form), it checks the factors of ``OuterProductGrads`` with an
    independent formula and exercises the fallback to ``fn`` on the other forms.
    """
    if isinstance(grads, OuterProductGrads) and not grads.has_sequence:
        return ((grads.d @ param) * grads.a).sum(1)
    if isinstance(grads, EmbeddingGrads):
        return grads.dot(param.unsqueeze(0))[:, 0]
    return NotImplemented


PROJECTION = per_sample_projection("test_directions", directions)
CUBES = per_sample_transform("test_cubes", _cubes, reduce="sum")
ABS_MAX = per_sample_transform("test_abs_max", _abs_max, reduce="gather")
DOTS = per_sample_transform("test_dots", dots, reduce="gather", factored_fn=_dots_factored)

ALL_STATS: tuple[Statistic, ...] = (
    BATCH_L2,
    SUM_GRAD_SQUARED,
    BATCH_DOT,
    GRAD_BATCH,
    BATCH_PROJECTION,
    PROJECTION,
    CUBES,
    ABS_MAX,
    DOTS,
)
"""Every per-sample kind the core offers (and transforms of each reduction)."""


def note_error(group: str, err: float) -> None:
    """Remember the largest error of ``group`` for the terminal summary."""
    MAX_ERRORS[group] = max(MAX_ERRORS.get(group, 0.0), err)


def recorder(stats: Sequence[Statistic], every: Callable[[int], bool] | None = None) -> Quantity:
    """A quantity that keeps a copy of every requested statistic (or why it is missing)."""

    class Recorder(Quantity):
        name = "recorder"
        REQUIREMENTS = Requirements(statistics=tuple(stats))

        def __init__(self) -> None:
            super().__init__(schedule=every)
            self.values: dict[int, dict[tuple, list]] = {}
            self.missing: dict[int, dict[tuple, str]] = {}

        def compute(self, ctx: Any) -> float:
            step = ctx.step if hasattr(ctx, "step") else len(self.values)
            values, missing = {}, {}
            for stat in stats:
                try:
                    row = ctx.stat(stat)
                except UnsupportedModelError as err:
                    missing[stat.identity] = str(err)
                    continue
                values[stat.identity] = [None if t is None else t.clone() for t in row]
            self.values[step] = values
            self.missing[step] = missing
            return 0.0

    return Recorder()


@dataclass
class Run:
    """One tracked run and its reference."""

    cockpit: Cockpit
    quantity: Any
    model: torch.nn.Module
    reference_model: torch.nn.Module
    names: list[str]
    grads: list[list[Tensor]] = field(default_factory=list)  # per step, per parameter p.grad
    per_sample: list[list[Tensor]] = field(default_factory=list)  # per step, per parameter
    params: list[list[Tensor]] = field(default_factory=list)  # per step, after the forward

    def values(self, step: int = 0) -> dict[tuple, list]:
        return self.quantity.values[step]

    def missing(self, step: int = 0) -> dict[tuple, str]:
        return self.quantity.missing[step]


def run(
    model: torch.nn.Module,
    losses_fn: Callable[[torch.nn.Module, int], Tensor],
    stats: Sequence[Statistic] = ALL_STATS,
    *,
    backend: Any = "hooks",
    steps: int = 1,
    loss_fn: Any = None,
    seed: int = 0,
    every: Callable[[int], bool] | None = None,
    on_error: str = "raise",
    before: Callable[[Cockpit, torch.nn.Module], None] | None = None,
    inputs: Sequence[Any] | None = None,
) -> Run:
    """Train ``steps`` tracked steps of ``model`` and compute the reference of each.

    ``losses_fn(model, step)`` returns the per-sample losses ``[B]`` of the step's batch;
    the optimizer is plain SGD. The reference model is a copy trained the same way, its
    per-sample gradients from one autograd call per sample; each step's forward pass of
    both runs starts from the same RNG state (dropout). ``inputs[step]`` goes to
    ``info["inputs"]`` (for the ``torch.func`` provider, with ``loss_fn``).
    """
    ref_model = copy.deepcopy(model)
    quantity = recorder(stats, every)
    cp = Cockpit(model.named_parameters(), [quantity], backend=backend, on_error=on_error)
    cp.attach(model, loss_fn)
    if before is not None:
        before(cp, model)
    names = [n for n, _ in model.named_parameters()]
    result = Run(cp, quantity, model, ref_model, names)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    for step in range(steps):
        torch.manual_seed(seed + step)
        opt.zero_grad()
        losses = losses_fn(model, step)
        loss = losses.mean()
        info = {"loss": loss, "batch_size": losses.shape[0], "individual_losses": losses.detach()}
        if inputs is not None:
            info["inputs"] = inputs[step]
        with cp(step, info=info):
            loss.backward()
        result.grads.append(
            [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]
        )
        opt.step()
        torch.manual_seed(seed + step)
        ref_opt.zero_grad()
        ref_losses = losses_fn(ref_model, step)
        ref_params = list(ref_model.parameters())
        result.params.append([p.detach().clone() for p in ref_params])  # (max_norm renorms)
        result.per_sample.append(per_sample_loop(ref_losses, ref_params))
        ref_losses.mean().backward()
        for p, q in zip(model.parameters(), ref_params):  # training is unchanged
            assert (p.grad is None) == (q.grad is None)
            assert p.grad is None or relative_error(p.grad, q.grad) <= 1e-12
        ref_opt.step()
    return result


def check(
    result: Run,
    group: str,
    stats: Sequence[Statistic] = ALL_STATS,
    steps: Sequence[int] | None = None,
    only: Sequence[str] | None = None,
) -> float:
    """Assert that every statistic of every parameter (or of ``only``) equals its reference."""
    worst = 0.0
    for step in steps if steps is not None else range(len(result.per_sample)):
        missing = result.missing(step)
        assert not missing, missing
        values = result.values(step)
        for stat in stats:
            row = values[stat.identity]
            for i, name in enumerate(result.names):
                if only is not None and name not in only:
                    continue
                g = result.per_sample[step][i]
                param = result.params[step][i]
                expected = reference(stat, g, param)
                assert row[i] is not None, f"{stat.describe()} of {name!r} is missing"
                err = relative_error(row[i].to(expected.dtype), expected)
                assert err <= TOL, f"{stat.describe()} of {name!r} at step {step}: {err:.3g}"
                worst = max(worst, err)
    note_error(group, worst)
    return worst


@pytest.fixture
def h():
    """This module: the helpers above (``h.run``, ``h.check``, ``h.ALL_STATS``, ...)."""
    return sys.modules[__name__]


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: D103
    if MAX_ERRORS:
        terminalreporter.write_sep("-", "cockpit-hooks: largest relative errors vs autograd loop")
        for group, err in sorted(MAX_ERRORS.items()):
            terminalreporter.write_line(f"{group:40s} {err:.2e}")
