"""One process of the DDP transformer tests: module hooks on attention, embeddings, LayerNorm.

Run as ``python _transformer_worker.py RANK WORLD PORT OUT_DIR``. It trains the
transformer of ``_transformer_problem`` with ``Cockpit(model, ...)`` (module hooks) for
each local batch split of ``CONFIGS`` and writes ``OUT_DIR/rank{RANK}.pt``:
per split the output, the provider serving each parameter (``cp.check``) and the class
of the module owning it.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from _transformer_problem import (  # noqa: E402
    CONFIGS,
    QUANTITIES,
    STEPS,
    batch,
    make_model,
    owner_types,
)
from _worker import serve, weighted_average_hook  # noqa: E402

from cockpit_core import Cockpit, CockpitWarning  # noqa: E402


def run(rank: int, sizes: tuple[int, ...]) -> dict:
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    n = sum(sizes)
    if len(set(sizes)) > 1:  # DDP averages local means; weight them so p.grad is global
        ddp.register_comm_hook(None, weighted_average_hook(sizes[rank] / n))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    cp = Cockpit(model, QUANTITIES, on_error="raise")  # the model: module hooks
    lo = sum(sizes[:rank])
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[lo : lo + sizes[rank]], y[lo : lo + sizes[rank]]
        opt.zero_grad()
        out = ddp(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x), "optimizer": opt}
        with cp(step, info=info):
            loss.backward()
        opt.step()
    report = cp.check(model)
    return {
        "output": cp.get_output(),
        "ok": report.ok,
        "served": {name: p.served for p in report.params for name in p.names},
        "owners": owner_types(model),
    }


def compute_all(rank: int, out_dir: Path) -> dict:
    """Every configuration; a run-time fallback warning (e.g. to torch.func) is an error."""
    warnings.simplefilter("error", CockpitWarning)
    return {sizes: run(rank, sizes) for sizes in CONFIGS}


if __name__ == "__main__":
    serve(compute_all)
