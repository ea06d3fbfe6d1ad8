"""One process of the rank-failure tests: a quantity or a statistic fails on one rank only.

Run as ``python _failure_worker.py RANK WORLD PORT OUT_DIR SCENARIO`` (see ``SCENARIOS``).
Every scenario trains the small CNN of ``_problem`` for ``STEPS`` steps with
``on_error="warn"`` and saves ``{"output": cp.get_output(), "errors": cp.errors}``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _problem import batch, make_model  # noqa: E402
from _worker import serve  # noqa: E402
from cockpit_backpack import extend  # noqa: E402

from cockpit_core import (  # noqa: E402
    BATCH_L2,
    Cockpit,
    Quantity,
    QuantityConfig,
    Requirements,
    StepContext,
)

STEPS = 4
FAILING_STEP = 2
FAILING_RANK = 1
QUANTITIES: list[Any] = [
    "loss",
    "grad_norm",
    "norm_test",
    "inner_test",
    "update_size",
    "hess_trace",
    {"name": "hess_max_ev", "every": 1},
    "alpha",
]


def failing_here(step: int) -> bool:
    return (
        sys.argv[5] != "none"
        and dist.is_initialized()
        and dist.get_rank() == FAILING_RANK
        and step == FAILING_STEP
    )


class Flaky(Quantity):
    """The largest squared per-sample gradient norm; raises on one rank at one step."""

    name = "flaky"
    Config = QuantityConfig
    REQUIREMENTS = Requirements(statistics=(BATCH_L2,))

    def compute(self, ctx: StepContext) -> float:
        if failing_here(ctx.step):
            raise ValueError("flaky failed here")
        return float(sum(ctx.stat(BATCH_L2)).max())


class FlakyHVP(Quantity):
    """``v . H v`` for ``v`` the gradient; raises on one rank at one step before its product."""

    name = "flaky_hvp"
    Config = QuantityConfig
    REQUIREMENTS = Requirements(loss_graph=True)

    def compute(self, ctx: StepContext) -> float:
        if failing_here(ctx.step):
            raise ValueError("flaky_hvp failed here")
        hv = ctx.hvp(list(ctx.grads))
        return float(sum((g * h).sum() for g, h in zip(ctx.grads, hv)))


SCENARIOS = ("none", "quantity")


def run(rank: int, scenario: str) -> dict:
    model = make_model(torch.float64)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    quantities: list[Any] = [
        *QUANTITIES[:3],
        Flaky(),
        *QUANTITIES[3:6],
        FlakyHVP(),
        *QUANTITIES[6:],
    ]
    cp = Cockpit(model.named_parameters(), quantities, on_error="warn")
    for step in range(STEPS):
        x, y = batch(step, torch.float64)
        x, y = x[rank * 32 : (rank + 1) * 32], y[rank * 32 : (rank + 1) * 32]
        opt.zero_grad()
        out = ddp(x)
        loss = loss_fn(out, y)
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x), "optimizer": opt}
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return {"output": cp.get_output(), "errors": list(cp.errors)}


def compute(rank: int, out_dir: Path) -> dict:
    scenario = sys.argv[5]
    warnings.simplefilter("ignore")
    return run(rank, scenario)


if __name__ == "__main__":
    serve(compute)
