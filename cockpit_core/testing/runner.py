"""Train a tiny problem with a Cockpit and record what a reference test needs at each step."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from cockpit_core.check.coverage import reads_forward_pass
from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import CockpitWarning
from cockpit_core.plugin.registry import Registry
from cockpit_core.testing.problems import Problem


@dataclass
class StepSnapshot:
    """The state of one training step, captured before the optimizer step.

    Attributes:
        step: Step number.
        params: Parameter values during the step (detached copies).
        params_after: Parameter values after the optimizer step.
        x: Mini-batch inputs.
        y: Mini-batch targets.
        loss: Mean mini-batch loss.
        grads: Mini-batch gradients.
        lr: Learning rate of each parameter (from the optimizer's param groups).

    """

    step: int
    params: list[torch.Tensor]
    params_after: list[torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    loss: float
    grads: list[torch.Tensor]
    lr: list[float]


@dataclass
class RunResult:
    """Output of :func:`run_cockpit`."""

    cockpit: Cockpit
    model: torch.nn.Module
    problem: Problem
    snapshots: list[StepSnapshot] = field(default_factory=list)

    @property
    def output(self) -> dict[int, dict[str, Any]]:
        """``cockpit.get_output()``."""
        return self.cockpit.get_output()

    def model_at(self, step: int) -> torch.nn.Module:
        """A fresh copy of the model with the parameters it had during ``step``."""
        model = self.problem.make_model()
        with torch.no_grad():
            for p, v in zip(model.parameters(), self.snapshots[step].params):
                p.copy_(v)
        return model


OPTIMIZERS: dict[str, Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}


def run_cockpit(
    problem: Problem,
    quantities: Any,
    steps: int = 3,
    optimizer: str = "sgd",
    registry: Registry | None = None,
    info_extra: dict[str, Any] | None = None,
    attach: bool | None = None,
    **cockpit_kwargs: Any,
) -> RunResult:
    """Train ``problem`` for ``steps`` steps with a Cockpit tracking ``quantities``.

    The ``info`` dict holds ``loss``, ``individual_losses``, ``batch_size`` and
    ``optimizer``. Each step's snapshot allows brute-force reference computations.
    With ``attach=True`` the model and ``problem.individual_losses`` are attached
    (``cp.attach``) and ``info`` also holds ``inputs`` and ``targets``; by default
    (``None``) only if a quantity reads the forward pass (declares probes).
    """
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = OPTIMIZERS[optimizer](model.parameters())
    with warnings.catch_warnings():  # the model is attached right below when it is needed
        warnings.filterwarnings("ignore", "cockpit: .* read the forward pass", CockpitWarning)
        cp = Cockpit(model.named_parameters(), quantities, registry=registry, **cockpit_kwargs)
    if attach is None:
        attach = any(reads_forward_pass(q) for q in cp.quantities)
    if attach:
        cp.attach(model, problem.individual_losses)
    result = RunResult(cp, model, problem)
    for step in range(steps):
        x, y = problem.batch(step)
        opt.zero_grad()
        outputs = model(x)
        loss = loss_fn(outputs, y)
        losses = problem.individual_losses(outputs, y).detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x), "optimizer": opt}
        if attach:
            info.update(inputs=x, targets=y)
        info.update(info_extra or {})
        before = [p.detach().clone() for p in model.parameters()]
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        grads = [_gradient(name, p) for name, p in model.named_parameters()]
        opt.step()
        lrs = [g["lr"] for g in opt.param_groups for _ in g["params"]]
        after = [p.detach().clone() for p in model.parameters()]
        result.snapshots.append(
            StepSnapshot(step, before, after, x, y, float(loss.detach()), grads, lrs)
        )
    return result


def _gradient(name: str, param: torch.nn.Parameter) -> torch.Tensor:
    """A detached copy of ``param.grad``; every parameter of a test problem receives one."""
    if param.grad is None:
        raise ValueError(
            f"parameter {name!r} of the problem's model received no gradient: run_cockpit "
            "records every parameter's gradient, so every parameter must take part in the loss."
        )
    return param.grad.detach().clone()
