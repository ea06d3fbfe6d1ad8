"""One process of the DDP tests: trains a small CNN with a Cockpit and saves its output.

Run as ``python _worker.py RANK WORLD PORT OUT_DIR``. It runs every configuration of
``CONFIGS`` (dtype, local batch sizes) with each of ``PROVIDERS`` and writes
``OUT_DIR/rank{RANK}.pt``.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _problem import PROVIDERS, QUANTITIES, STEPS, batch, cockpit_params, make_model  # noqa: E402
from cockpit_backpack import extend

from cockpit_core import Cockpit  # noqa: E402

CONFIGS = [
    ("float64", (32, 32)),
    ("float64", (40, 24)),
    ("float32", (32, 32)),
    ("float32", (40, 24)),
]


def weighted_average_hook(weight: float):
    """DDP communication hook: sum_r (B_r / N) grad_r, the gradient of the global mean loss."""

    def hook(state, bucket):
        t = bucket.buffer().mul_(weight)
        fut = dist.all_reduce(t, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    return hook


def run(rank: int, dtype: torch.dtype, sizes: tuple[int, ...], provider: str) -> dict:
    model = make_model(dtype)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    n = sum(sizes)
    if len(set(sizes)) > 1:  # DDP averages local means; weight them so p.grad is global
        ddp.register_comm_hook(None, weighted_average_hook(sizes[rank] / n))
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    cp = Cockpit(cockpit_params(model, provider), QUANTITIES, on_error="raise")
    lo = sum(sizes[:rank])
    for step in range(STEPS):
        x, y = batch(step, dtype)
        x, y = x[lo : lo + sizes[rank]], y[lo : lo + sizes[rank]]
        opt.zero_grad()
        out = ddp(x)
        loss = loss_fn(out, y)
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x), "optimizer": opt}
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp.get_output()


def run_accumulated(rank: int, dtype: torch.dtype, micro: int, provider: str) -> dict:
    """Local batch 32 as micro-batches of ``micro``; DDP syncs only on the last one."""
    model = make_model(dtype)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    cp = Cockpit(cockpit_params(model, provider), QUANTITIES, on_error="raise")
    local = 32
    for step in range(STEPS):
        x, y = batch(step, dtype)
        x, y = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
        opt.zero_grad()
        with cp(step, info={"batch_size": local, "optimizer": opt}, accumulate=True) as run:
            for lo in range(0, local, micro):
                xb, yb = x[lo : lo + micro], y[lo : lo + micro]
                last = lo + micro >= local
                with contextlib.nullcontext() if last else ddp.no_sync():
                    out = ddp(xb)
                    loss = loss_fn(out, yb) * (len(xb) / local)
                    losses = torch.nn.functional.cross_entropy(out, yb, reduction="none")
                    info = {
                        "loss": loss,
                        "individual_losses": losses.detach(),
                        "batch_size": len(xb),
                    }
                    with run.micro_batch(info):
                        loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp.get_output()


def write_logs(rank: int, out_dir: Path) -> None:
    """One step with a log per policy: default (rank 0 writes) and write_on="all"."""
    model = make_model(torch.float64)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    x, y = batch(0, torch.float64)
    x, y = x[rank * 32 : (rank + 1) * 32], y[rank * 32 : (rank + 1) * 32]
    for policy in ("rank0", "all"):
        log = out_dir / f"{policy}-rank{rank}.jsonl"
        cp = Cockpit(model.named_parameters(), ["loss"], log=log, write_on=policy)
        loss = loss_fn(ddp(x), y)
        with cp(0, info={"loss": loss, "batch_size": len(x)}):
            loss.backward()
        cp.close()


def serve(compute: Callable[[int, Path], Any]) -> None:
    """Run ``compute(rank, out_dir)`` as one gloo process; save its result as ``rank<r>.pt``.

    The command line is ``RANK WORLD PORT OUT_DIR`` (what the tests' launcher passes).
    """
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        torch.save(compute(rank, Path(out_dir)), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def compute_all(rank: int, out_dir: Path) -> dict:
    """Every configuration of this worker, and the logs of rank ``rank``."""
    results = {}
    for provider in PROVIDERS:
        for name, sizes in CONFIGS:
            results[(name, sizes, provider)] = run(rank, getattr(torch, name), sizes, provider)
        results[("float64", "accumulate 2x16", provider)] = run_accumulated(
            rank, torch.float64, 16, provider
        )
    write_logs(rank, out_dir)
    return results


if __name__ == "__main__":
    serve(compute_all)
