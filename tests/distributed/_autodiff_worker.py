"""One process of the ``autodiff`` DDP test: curvature diagonals recomputed per process.

Run as ``python _autodiff_worker.py RANK WORLD PORT OUT_DIR``. It trains the problem of
``_autodiff_problem`` under DDP on its part of each global batch (local sizes ``SIZES``,
unequal) with ``Cockpit(model, QUANTITIES)`` and ``cp.attach(model, per-sample loss)``, and
writes ``OUT_DIR/rank{RANK}.pt``: the output and the provider serving each parameter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from _autodiff_problem import PROBLEM, QUANTITIES, STEPS, info_of  # noqa: E402
from _worker import serve, weighted_average_hook  # noqa: E402

from cockpit_core import Cockpit  # noqa: E402

SIZES = (4, 2)
"""Local batch sizes of the 2 processes (the global batch has 6 samples)."""


def run(rank: int) -> dict:
    model = PROBLEM.make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, weighted_average_hook(SIZES[rank] / sum(SIZES)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    cp = Cockpit(model, QUANTITIES, on_error="raise")
    cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    lo = sum(SIZES[:rank])
    for step in range(STEPS):
        x, y = PROBLEM.batch(step)
        x, y = x[lo : lo + SIZES[rank]], y[lo : lo + SIZES[rank]]
        opt.zero_grad()
        info = info_of(x, y, ddp(x))
        with cp(step, info=info):
            info["loss"].backward()
        opt.step()
    return {"output": cp.get_output(), "check": str(cp.check(model))}


if __name__ == "__main__":
    serve(lambda rank, out_dir: run(rank))
