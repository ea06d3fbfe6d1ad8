"""A tiny training run that the rule tests drive into (or away from) each condition."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cockpit_core import Cockpit


class Scale(torch.nn.Module):
    """Multiplies its input by a constant (``0.0`` makes every layer before it dead)."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def make_data(seed: int, task: str = "classify", n: int = 512, dim: int = 8):
    """Gaussian inputs and targets of a random linear teacher plus noise.

    ``classify``: 3 classes (the teacher's argmax); ``regress``: one real target;
    ``noise``: a real target independent of the inputs (nothing to learn but its mean).
    """
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n, dim, generator=gen)
    if task == "regress":
        return x, x @ torch.randn(dim, 1, generator=gen) + 0.1 * torch.randn(n, 1, generator=gen)
    if task == "noise":
        return x, torch.randn(n, 1, generator=gen)
    teacher = torch.randn(dim, 3, generator=gen)
    return x, (x @ teacher + 0.5 * torch.randn(n, 3, generator=gen)).argmax(1)


def make_model(seed: int, outputs: int = 3, dim: int = 8, dead: bool = False):
    """An 8-16-``outputs`` tanh MLP; ``dead`` multiplies the first layer's output by 0."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(dim, 16)]
    if dead:
        layers.append(Scale(0.0))
    layers += [torch.nn.Tanh(), torch.nn.Linear(16, outputs)]
    return torch.nn.Sequential(*layers)


def per_sample_losses(task: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each sample, or its squared error for ``regress``."""
    if task in ("regress", "noise"):
        return ((out - y) ** 2).sum(1)
    return torch.nn.functional.cross_entropy(out, y, reduction="none")


def train(
    quantities: list[Any],
    *,
    steps: int,
    lr: float,
    batch: int = 32,
    seed: int = 0,
    momentum: float = 0.0,
    dead: bool = False,
    task: str = "classify",
    weight_decay: float = 0.0,
    target_offset: float = 0.0,
    log: Path | None = None,
    **cockpit_options: Any,
) -> dict[int, dict[str, Any]]:
    """Train with SGD and cockpit tracking ``quantities`` every step; return the output.

    Mini-batches are drawn with replacement from 512 samples (a generator per seed); the
    loss is the mean of :func:`per_sample_losses`. ``target_offset`` is added to real
    targets (``regress``, ``noise``); ``weight_decay`` is SGD's.
    """
    x, y = make_data(seed, task)
    if task in ("regress", "noise"):
        y = y + target_offset
    model = make_model(seed, 1 if task in ("regress", "noise") else 3, dead=dead)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skipped steps of diverging runs warn; tests look
        cp = Cockpit(model, quantities, log=log, **cockpit_options)
        gen = torch.Generator().manual_seed(seed)
        for step in range(steps):
            idx = torch.randint(0, len(x), (batch,), generator=gen)
            opt.zero_grad()
            losses = per_sample_losses(task, model(x[idx]), y[idx])
            loss = losses.mean()
            info = {
                "loss": loss,
                "individual_losses": losses.detach(),
                "batch_size": batch,
                "optimizer": opt,
            }
            with cp(step, info=info):
                loss.backward(retain_graph=cp.retain_graph(step))
            opt.step()
        cp.close()
    return cp.get_output()


def train_layers(
    quantities: list[Any],
    *,
    steps: int,
    lr: float,
    seed: int = 0,
    batch: int = 32,
    factors: dict[str, float] | None = None,
    spike: tuple[int, dict[str, float]] | None = None,
    log: Path | None = None,
    **cockpit_options: Any,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Train the classifier with one SGD param group per parameter; return output and header.

    Parameter ``name`` trains with ``lr * factors[name]``; ``spike = (step, {name: f})``
    multiplies the learning rate of the named parameters by ``f`` for the update of that one
    step (the loss then spikes at ``step + 1``, measured at the parameters it moved). Every
    step logs its batch as ``cp.log(step, batch_id=1000 + step)``.
    """
    x, y = make_data(seed)
    model = make_model(seed)
    factors = factors or {}
    groups = [
        {"params": [p], "lr": lr * factors.get(n, 1.0), "name": n}
        for n, p in model.named_parameters()
    ]
    opt = torch.optim.SGD(groups, lr=lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cp = Cockpit(model, quantities, log=log, **cockpit_options)
        gen = torch.Generator().manual_seed(seed)
        for step in range(steps):
            idx = torch.randint(0, len(x), (batch,), generator=gen)
            opt.zero_grad()
            losses = per_sample_losses("classify", model(x[idx]), y[idx])
            loss = losses.mean()
            info = {"loss": loss, "individual_losses": losses.detach(), "batch_size": batch}
            with cp(step, info=info):
                loss.backward(retain_graph=cp.retain_graph(step))
            boost = spike[1] if spike is not None and step == spike[0] else {}
            for group in opt.param_groups:
                group["lr"] = lr * factors.get(group["name"], 1.0) * boost.get(group["name"], 1.0)
            opt.step()
            cp.log(step, batch_id=1000 + step)
        cp.close()
    return cp.get_output(), cp.header()


@pytest.fixture
def layers():
    """The function :func:`train_layers`."""
    return train_layers


@pytest.fixture
def run():
    """The function :func:`train`."""
    return train


@pytest.fixture
def kit():
    """The helpers :func:`make_data`, :func:`make_model` and :func:`per_sample_losses`."""
    return SimpleNamespace(
        make_data=make_data, make_model=make_model, per_sample_losses=per_sample_losses
    )
