"""Shared tiny problems (float64, fixed seeds) for reference tests of quantities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cockpit_core.plugin.registry import default_registry


def prepared(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` readied for every installed statistics provider (BackPACK extends it).

    Without a known model (``Cockpit(model.named_parameters(), ...)``) cockpit computes
    per-sample statistics with BackPACK, and curvature diagonals always need it; modules
    prepared here work with it, and with every other provider once the model is known
    (:meth:`Registry.prepare_module <cockpit_core.plugin.registry.Registry.prepare_module>`).
    """
    return default_registry().prepare_module(module)


@dataclass
class Problem:
    """A tiny supervised problem: a model factory, data batches and a loss.

    Attributes:
        name: Short label (``"mlp"``, ``"cnn"``).
        make_model: Builds a fresh, deterministic model (float64).
        inputs: All inputs; batches are drawn from them.
        targets: All targets.
        batch_size: Size of every mini-batch.
        loss: ``"cross_entropy"`` or ``"mse"``; always mean-reduced for training.

    """

    name: str
    make_model: Callable[[], torch.nn.Module]
    inputs: torch.Tensor
    targets: torch.Tensor
    batch_size: int = 8
    loss: str = "cross_entropy"
    seed: int = 0
    _gen: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._gen = torch.Generator().manual_seed(self.seed)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The mini-batch of ``step`` (deterministic per step)."""
        gen = torch.Generator().manual_seed(self.seed * 100_003 + step)
        idx = torch.randperm(len(self.inputs), generator=gen)[: self.batch_size]
        return self.inputs[idx], self.targets[idx]

    def loss_module(self) -> torch.nn.Module:
        """The mean-reduced loss module (extended for BackPACK when it is installed)."""
        mod = torch.nn.CrossEntropyLoss() if self.loss == "cross_entropy" else torch.nn.MSELoss()
        return prepared(mod)

    def individual_losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample losses ``l_n`` (the mini-batch loss is their mean)."""
        if self.loss == "cross_entropy":
            return F.cross_entropy(outputs, targets, reduction="none")
        return ((outputs - targets) ** 2).flatten(1).mean(1)


def tiny_mlp(batch_size: int = 8, seed: int = 0, loss: str = "cross_entropy") -> Problem:
    """A 6-5-4-3 tanh/ReLU MLP on random data (about 70 parameters), float64."""

    def make() -> torch.nn.Module:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 5),
            torch.nn.Tanh(),
            torch.nn.Linear(5, 4),
            torch.nn.ReLU(),
            torch.nn.Linear(4, 3),
        )
        return prepared(model.double())

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(64, 6, generator=gen, dtype=torch.float64)
    if loss == "cross_entropy":
        y = torch.randint(0, 3, (64,), generator=gen)
    else:
        y = torch.randn(64, 3, generator=gen, dtype=torch.float64)
    return Problem("mlp", make, x, y, batch_size, loss, seed)


def tiny_cnn(batch_size: int = 6, seed: int = 0) -> Problem:
    """A conv(1->2, 3x3)-ReLU-maxpool-linear(->3) network on 1x6x6 inputs, float64."""

    def make() -> torch.nn.Module:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 2, 3),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 3),
        )
        return prepared(model.double())

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(48, 1, 6, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (48,), generator=gen)
    return Problem("cnn", make, x, y, batch_size, "cross_entropy", seed)
