"""The problem shared by the DDP worker processes and the single-process reference."""

from __future__ import annotations

import torch
from cockpit_backpack import extend

STEPS = 3
GLOBAL_BATCH = 64
QUANTITIES = [
    "loss",
    "grad_norm",
    "distance",
    "update_size",
    "param_norm",
    "update_ratio",
    "noise_scale",
    "norm_test",
    "inner_test",
    "ortho_test",
    "mean_gsnr",
    "early_stopping",
    {"name": "cabs", "lr": 0.05},
    "tic_diag",
    "tic_trace",
    "hess_trace",
    {"name": "hess_max_ev", "every": 2},
    "grad_hist_1d",
    {"name": "grad_hist_2d", "every": 2},
    "alpha",
]


PROVIDERS = ("backpack", "hooks")
"""How the Cockpit is built: ``backpack`` (no model given: BackPACK computes everything) or
``hooks`` (the model given: module hooks compute the per-sample statistics, BackPACK only
the curvature diagonals)."""


def cockpit_params(model: torch.nn.Module, provider: str):
    """What to pass to ``Cockpit(...)`` for ``provider`` (see :data:`PROVIDERS`)."""
    return model if provider == "hooks" else model.named_parameters()


def make_model(dtype: torch.dtype) -> torch.nn.Module:
    """A small CNN: conv(1->3, 3x3)-ReLU-maxpool-conv(3->4)-ReLU-flatten-linear(->5)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(3, 4, 2),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(36, 5),
    )
    return extend(model.to(dtype))


def batch(step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (64 samples of 1x10x10 images, 5 classes)."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 1, 10, 10, generator=gen, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 5, (GLOBAL_BATCH,), generator=gen)
    return x, y
