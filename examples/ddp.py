"""Track a DistributedDataParallel training on 2 CPU processes (gloo, loopback; seconds).

Each process trains the same small CNN on its own 32 of the 64 samples of every step.
The Cockpit combines the processes' statistics when each ``with cp(step, ...)`` block ends,
so every quantity describes the global batch of 64, the same values one process holding
all 64 samples reports (``docs/distributed.md``). Rank 0 writes the log; the example then
repeats the training in one process and prints both for comparison::

    python examples/ddp.py [LOG_PATH]

With ``torchrun`` instead of ``torch.multiprocessing``, call ``train(rank, world, ...)``
after ``dist.init_process_group("gloo")`` with ``RANK``/``WORLD_SIZE`` from the environment.
"""

from __future__ import annotations

import os
import socket
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from cockpit_backpack import extend

from cockpit_core import Cockpit

STEPS, GLOBAL_BATCH, WORLD = 10, 64, 2
QUANTITIES = [
    "loss",
    "grad_norm",
    "norm_test",
    "inner_test",
    "mean_gsnr",
    "early_stopping",
    "alpha",
]
# BackPACK's module hooks fire on the first layer, whose input needs no gradient: harmless
warnings.filterwarnings("ignore", message="Full backward hook is firing")


def make_model() -> torch.nn.Module:
    """conv-ReLU-maxpool-conv-ReLU-linear on 1x10x10 images, 5 classes, extended for BackPACK."""
    torch.manual_seed(0)
    return extend(
        torch.nn.Sequential(
            torch.nn.Conv2d(1, 3, 3),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(3, 4, 2),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(36, 5),
        )
    )


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The 64 samples of ``step`` (the same on every process; each takes its share)."""
    gen = torch.Generator().manual_seed(step)
    return torch.randn(GLOBAL_BATCH, 1, 10, 10, generator=gen), torch.randint(
        0, 5, (GLOBAL_BATCH,), generator=gen
    )


def train(rank: int, world: int, log: str | None = None) -> dict:
    """Train ``STEPS`` steps on this process's share of each batch; return the Cockpit output."""
    model = make_model()
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    # built after init_process_group: distributed="auto" combines the processes
    cp = Cockpit(model.named_parameters(), QUANTITIES, log=log)
    local = GLOBAL_BATCH // world
    for step in range(STEPS):
        x, y = global_batch(step)
        x, y = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
        opt.zero_grad()
        out = net(x)
        loss = loss_fn(out, y)  # the local mean; the Cockpit weights it by B_r / N
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x), "optimizer": opt}
        with cp(step, info=info):
            loss.backward()
        opt.step()
    cp.close()
    return cp.get_output()


def worker(rank: int, world: int, port: int, log: str | None) -> None:
    """One process: join the group over the loopback interface, train, print on rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        out = train(rank, world, log)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        single = train(0, 1)  # one process on the same 64 samples per step
        for step in (0, STEPS - 2):  # alpha of a step needs the next one
            for name, res in (("2 processes", out), ("1 process  ", single)):
                v = res[step]
                print(
                    f"step {step}, {name}: loss {v['loss']:.6f}  "
                    f"|g| {v['grad_norm']['total']:.6f}  "
                    f"norm test {v['norm_test']['total']:.6f}  "
                    f"mean GSNR {v['mean_gsnr']['total']:.6f}  alpha {v['alpha']['alpha']:.6f}"
                )


def main() -> None:
    """Start ``WORLD`` processes with ``torch.multiprocessing``."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on the loopback interface
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = sys.argv[1] if len(sys.argv) > 1 else None
    mp.spawn(worker, args=(WORLD, port, log), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
