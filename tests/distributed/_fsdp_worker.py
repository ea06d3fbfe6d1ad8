"""One process of the FSDP2 tests: a small transformer under ``fully_shard``, with a Cockpit.

Run as ``python _fsdp_worker.py RANK WORLD PORT OUT_DIR``. Each process shards two
``nn.TransformerEncoderLayer`` blocks and the root with ``fully_shard`` (float64) and
trains on its half of each global batch, once per entry of ``RUNS``: without a Cockpit,
with ``Cockpit(model, "economy")`` (``distributed="auto"``, a log), with
``distributed="off"``, with a Cockpit built before ``fully_shard`` (``late``) and with
``on_error="raise"`` (what the block raises is caught here, per step). It saves, per run,
what was raised, the local losses, ``cp.errors``, ``cp.skipped``,
``cp.get_output()``, the CockpitWarnings raised and the final parameters (local shards).

With a fifth argument ``sync_failure`` it instead trains the same model unsharded under DDP
(local batches ``SYNC_SIZES``) twice per split: as it is, and with the gradient's part of
the end-of-step all-reduce failing on process ``FAILING_RANK`` at step ``FAILING_STEP``
only (an injected error), and saves both runs' output and errors.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).parent))

from _worker import serve  # noqa: E402

from cockpit_core import Cockpit, CockpitWarning, UnsupportedModelError  # noqa: E402
from cockpit_core.distributed.gradient import GlobalGradient  # noqa: E402

STEPS = 3
GLOBAL_BATCH, SEQ_LEN, D_MODEL, CLASSES = 8, 4, 8, 3
RUNS = ("plain", "economy", "off", "late", "raise")
SYNC_SIZES = [(4, 4), (5, 3)]
SYNC_QUANTITIES = ["loss", "grad_norm", "norm_test", "inner_test"]
FAILING_STEP, FAILING_RANK = 1, 1


class Blocks(torch.nn.Module):
    """Two encoder blocks (attention, LayerNorm, feed-forward) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(D_MODEL, 2, 16, dropout=0.0, batch_first=True)
            for _ in range(2)
        )
        self.head = torch.nn.Linear(D_MODEL, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def make_model() -> Blocks:
    torch.manual_seed(0)
    return Blocks().double()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: sequences ``[8, 4, 8]`` and their classes."""
    gen = torch.Generator().manual_seed(3000 + step)
    x = torch.randn(GLOBAL_BATCH, SEQ_LEN, D_MODEL, generator=gen, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (GLOBAL_BATCH,), generator=gen)
    return x, y


def run(rank: int, how: str, out_dir: Path) -> dict[str, Any]:
    model = make_model()
    cp = Cockpit(model, "economy") if how == "late" else None  # tracks what fully_shard replaces
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if how == "economy":
        cp = Cockpit(model, "economy", log=out_dir / "economy.jsonl")
    elif how == "off":
        cp = Cockpit(model, "economy", distributed="off")
    elif how == "raise":
        cp = Cockpit(model, "economy", on_error="raise")
    local = GLOBAL_BATCH // 2
    losses, raised = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CockpitWarning)
        for step in range(STEPS):
            x, y = batch(step)
            x, y = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
            opt.zero_grad()
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            if cp is None:
                loss.backward()
            else:
                per_sample = torch.nn.functional.cross_entropy(out, y, reduction="none")
                info = {
                    "loss": loss,
                    "individual_losses": per_sample.detach(),
                    "batch_size": local,
                    "optimizer": opt,
                }
                try:
                    with cp(step, info=info):
                        loss.backward()
                except UnsupportedModelError as err:
                    raised.append(str(err))
            opt.step()
            losses.append(float(loss.detach()))
        if cp is not None:
            cp.close()
    return {
        "names": [name for name, _ in model.named_parameters()],
        "types": sorted({type(p).__name__ for p in model.parameters()}),
        "losses": losses,
        "raised": raised,
        "params": [cast(DTensor, p).to_local().detach().clone() for p in model.parameters()],
        "errors": [] if cp is None else list(cp.errors),
        "skipped": [] if cp is None else list(cp.skipped),
        "output": {} if cp is None else cp.get_output(),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, CockpitWarning)],
    }


def run_ddp(rank: int, sizes: tuple[int, int], inject: bool) -> dict[str, Any]:
    """DDP, module hooks; with ``inject`` the gradient sync fails on one process at one step."""
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    cp = Cockpit(model, SYNC_QUANTITIES)
    original = GlobalGradient._pieces
    lo = sum(sizes[:rank])
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[lo : lo + sizes[rank]], y[lo : lo + sizes[rank]]
        opt.zero_grad()
        out = ddp(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        per_sample = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": per_sample, "batch_size": len(x)}
        failing = inject and step == FAILING_STEP and dist.get_rank() == FAILING_RANK

        def pieces(self: GlobalGradient, failing: bool = failing) -> list[torch.Tensor]:
            if failing:
                raise RuntimeError("injected failure")
            return original(self)

        GlobalGradient._pieces = pieces  # type: ignore[method-assign]
        try:
            with cp(step, info=info):
                loss.backward()
        finally:
            GlobalGradient._pieces = original  # type: ignore[method-assign]
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "output": cp.get_output(), "errors": list(cp.errors)}


def compute(rank: int, out_dir: Path) -> dict[Any, Any]:
    if sys.argv[5:] == ["sync_failure"]:
        warnings.simplefilter("ignore", CockpitWarning)
        return {
            (sizes, inject): run_ddp(rank, sizes, inject)
            for sizes in SYNC_SIZES
            for inject in (False, True)
        }
    return {how: run(rank, how, out_dir) for how in RUNS}


if __name__ == "__main__":
    serve(compute)
