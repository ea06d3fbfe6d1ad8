"""Every process's micro-batch gradient norms, gathered at the end of a tracked step.

Under ``torch.distributed`` each process records the squared norms of its own
micro-batches' local gradients (:mod:`cockpit_core.engine.micro_batch_norms`), before DDP
averages ``p.grad``. The global batch's micro-batches are all of them: process ``r``
contributes its ``K_r`` rows (a step without accumulation is one row, its local batch).
Two collectives: an all-gather of ``(K_r, failed_r)``, then one float64 all-reduce in which
each process writes its rows ``[b_m, share_m, |c_m,1|^2 .. |c_m,P|^2]`` at its offset of a
zero buffer (concatenation as a sum, as for the other gathered statistics). The layout
depends only on the gathered counts, so every process issues the same collectives whatever
failed locally; a failure on any process leaves every process the reason.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from cockpit_core.distributed.gradient import ReduceBuffer
from cockpit_core.engine.micro_batch_norms import MicroBatchNorms


def gather_norms(
    local: MicroBatchNorms | str,
    nparams: int,
    group: Any,
    rank: int,
    world: int,
    device: torch.device,
) -> MicroBatchNorms | str:
    """The micro-batches of every process, in rank order (or why some process has none).

    Args:
        local: This process's micro-batches, or why it has none.
        nparams: The number of tracked parameters (equal on every process).
        group: The process group.
        rank: This process's rank in ``group``.
        world: The number of processes.
        device: Where collective buffers live (the GPU for NCCL).

    """
    ok = isinstance(local, MicroBatchNorms)
    count = len(local) if isinstance(local, MicroBatchNorms) else 0
    header = torch.tensor([count, 0 if ok else 1], dtype=torch.int64, device=device)
    headers = [torch.zeros_like(header) for _ in range(world)]
    dist.all_gather(headers, header, group=group)
    table = torch.stack(headers).cpu()
    counts = [int(k) for k in table[:, 0]]
    failed = [r for r in range(world) if int(table[r, 1])]
    width = nparams + 2
    rows = torch.zeros(count, width, dtype=torch.float64)
    if isinstance(local, MicroBatchNorms):
        try:
            rows = torch.cat(
                [
                    torch.tensor(local.samples, dtype=torch.float64).reshape(-1, 1),
                    torch.tensor(local.shares, dtype=torch.float64).reshape(-1, 1),
                    local.contributions.detach().to("cpu", torch.float64).reshape(count, -1),
                ],
                dim=1,
            )
            if rows.shape != (count, width):
                raise ValueError(f"{tuple(rows.shape)} values, expected {(count, width)}")
        except Exception as err:  # contribute NaN: the same collectives, a useless value
            local = f"packing the micro-batch norms raised {type(err).__name__}: {err}"
            rows = torch.full((count, width), float("nan"), dtype=torch.float64)
    if failed or not sum(counts):  # known to every process: no all-reduce
        here = f" (here: {local})" if isinstance(local, str) else ""
        return (
            f"the micro-batch gradient norms are missing on process(es) {failed}{here}"
            if failed
            else "no process recorded a micro-batch's backward pass"
        )
    buf = ReduceBuffer(device)
    slot = buf.add_rows(rows, [k * width for k in counts], rank)
    table_all = buf.all_reduce(group)[slot].reshape(-1, width).cpu()
    if isinstance(local, str):  # packing failed here: the others got NaN from this process
        return local
    if not bool(torch.isfinite(table_all[:, 2:]).all()):
        return "the micro-batch gradient norms of some process were not finite or not packed"
    return MicroBatchNorms(
        table_all[:, 2:].contiguous(),
        tuple(int(b) for b in table_all[:, 0]),
        tuple(float(s) for s in table_all[:, 1]),
        tuple(r for r in range(world) for _ in range(counts[r])),
    )
