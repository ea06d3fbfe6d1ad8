"""One process of the DDP test of noise_scale_cheap: its micro-batches, saved outputs.

Run as ``python _noise_scale_ddp_worker.py RANK WORLD PORT OUT_DIR``. For each configuration
of :data:`CONFIGS` (every rank's micro-batch sizes) it tracks ``noise_scale_cheap`` for
:data:`STEPS` steps of a DDP-wrapped MLP on this rank's share of the global batch
(DDP synchronises on the last micro-batch only) and writes ``OUT_DIR/rank{RANK}.pt``.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from cockpit_health import NoiseScaleCheap

from cockpit_core import Cockpit

CONFIGS = {
    "accumulated": ((3, 5), (4, 4)),  # equal local batches, unequal micro-batches
    "unequal": ((2, 4), (5, 5)),  # unequal local batches
    "one_each": ((6,), (10,)),  # no accumulation: each process's batch is a micro-batch
}
STEPS = 2


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)
    ).double()


def global_batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(n, 2, generator=gen, dtype=torch.float64) + 1.0
    return x, y


def run(rank: int, sizes: tuple[tuple[int, ...], ...]) -> dict:
    model = mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = torch.nn.MSELoss()
    cp = Cockpit(model.named_parameters(), [NoiseScaleCheap(ema=0.0)], on_error="raise")
    mine = sizes[rank]
    local = sum(mine)
    offset = sum(sum(s) for s in sizes[:rank])
    for step in range(STEPS):  # no optimizer step: the reference uses the same parameters
        x, y = global_batch(step, sum(sum(s) for s in sizes))
        x, y = x[offset : offset + local], y[offset : offset + local]
        model.zero_grad()
        if len(mine) == 1:
            loss = loss_fn(ddp(x), y)
            with cp(step, info={"batch_size": local}):
                loss.backward()
            continue
        with cp(step, info={"batch_size": local}, accumulate=True) as run_:
            lo = 0
            for k, b in enumerate(mine):
                last = k == len(mine) - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    loss = loss_fn(ddp(x[lo : lo + b]), y[lo : lo + b]) * (b / local)
                    with run_.micro_batch({"batch_size": b}):
                        loss.backward()
                lo += b
    return cp.get_output()


def main() -> None:
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
        results = {name: run(rank, sizes) for name, sizes in CONFIGS.items()}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
