"""One process of the FSDP2 tests: a small transformer under ``fully_shard``, with a Cockpit.

Run as ``python _fsdp_worker.py RANK WORLD PORT OUT_DIR``. Each process shards two
``nn.TransformerEncoderLayer`` blocks and the root with ``fully_shard`` (float64) and
trains on its part of each global batch (local batches ``SIZES``), once per entry of
``RUNS``: without a Cockpit (``plain``), with ``Cockpit(model, QUANTITIES + the
shard-aware test quantities)`` (``exact``, a log for equal batches, with a spy on every
gather and redistribution that cockpit's own code issues, and the memory it gathers into; ``no_reshard`` likewise with
``reshard_after_forward=False`` on the blocks), with a shard-aware quantity that fails on
process 1 only before its ``shard_sum`` (``flaky``), over two micro-batches per step
(``accumulate``), with ``distributed="off"``,
with a Cockpit built before ``fully_shard`` (``late``) and with ``on_error="raise"``
(what the block raises is caught here, per step). It saves, per run, what was raised, the
local losses, ``cp.errors``, ``cp.skipped``, ``cp.check`` (``exact``), ``cp.get_output()``, the CockpitWarnings
raised, the final parameters (local shards) and what the spy saw.

With a fifth argument ``sync_failure`` it instead trains the same model unsharded under DDP
(local batches ``SYNC_SIZES``) twice per split: as it is, and with the gradient's part of
the end-of-step all-reduce failing on process ``FAILING_RANK`` at step ``FAILING_STEP``
only (an injected error), and saves both runs' output and errors.
"""

from __future__ import annotations

import functools
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).parent))

from _fsdp_quantities import (  # noqa: E402
    ShardDistance,
    ShardFlaky,
    ShardGradNorm,
    ShardMeanGSNR,
    ShardNormTest,
)
from _worker import serve  # noqa: E402

from cockpit_core import Cockpit, CockpitWarning, UnsupportedModelError  # noqa: E402
from cockpit_core.distributed.gradient import GlobalGradient  # noqa: E402

STEPS = 3
GLOBAL_BATCH, SEQ_LEN, D_MODEL, CLASSES = 8, 4, 8, 3
LR = 0.1
SIZES = [(4, 4), (5, 3)]
RUNS = [
    *(("plain", s) for s in SIZES),
    *(("exact", s) for s in SIZES),
    ("no_reshard", SIZES[0]),
    ("flaky", SIZES[0]),
    ("accumulate", SIZES[0]),
    ("off", SIZES[0]),
    ("late", SIZES[0]),
    ("raise", SIZES[0]),
]
QUANTITIES: list[Any] = [
    "loss",
    "grad_norm",
    "distance",
    "update_size",
    "param_norm",
    "update_ratio",
    "optimizer_hparams",
    "parameters",
    "norm_test",
    "inner_test",
    "ortho_test",
    "mean_gsnr",
    "early_stopping",
    {"name": "cabs", "lr": LR},
    {"name": "cabs", "label": "cabs_optimizer"},  # the learning rate from the optimizer
    "noise_scale",
    "grad_hist_1d",
    "alpha",
    {"name": "hess_max_ev", "every": 2},
    "noise_scale_cheap",
]
SYNC_SIZES = [(4, 4), (5, 3)]
SYNC_QUANTITIES = ["loss", "grad_norm", "norm_test", "inner_test"]
FAILING_STEP, FAILING_RANK = 1, 1


def quantities() -> list[Any]:
    """``QUANTITIES`` and the shard-aware test quantities (new instances)."""
    return [*QUANTITIES, ShardGradNorm(), ShardDistance(), ShardMeanGSNR(), ShardNormTest()]


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


# -- the spy: what cockpit's own code gathers ------------------------------------------------

_OURS = ("/cockpit_core/", "/plugins/cockpit-")


def _from_cockpit() -> bool:
    return any(any(mark in f.filename for mark in _OURS) for f in traceback.extract_stack())


@contextmanager
def spy(seen: list[tuple[str, str, int, int, int]]) -> Iterator[None]:
    """Record every gather or redistribution cockpit's code issues.

    Wraps ``DTensor.full_tensor``/``redistribute`` (which would gather a parameter), the
    DTensor redistribution kernel and the gather collectives of ``torch.distributed``.
    Each call adds ``(what, dtype, numel, storage, nbytes)`` of its first tensor: the
    address and size of the memory it lives in (two gathers into one address can not be
    alive at once).
    """
    import torch.distributed.tensor._redistribute as redistribute_module

    targets: list[tuple[Any, str]] = [
        (DTensor, "full_tensor"),
        (DTensor, "redistribute"),
        (redistribute_module, "redistribute_local_tensor"),
        (dist, "all_gather"),
        (dist, "all_gather_into_tensor"),
        (dist, "all_gather_object"),
        (dist, "broadcast"),
    ]
    if hasattr(dist, "all_gather_single"):  # torch >= 2.13
        targets.append((dist, "all_gather_single"))
    originals = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _from_cockpit():
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                lists = [a for a in args if isinstance(a, list) and a]
                t = tensors[0] if tensors else (lists[0][0] if lists else None)
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    where = (storage.data_ptr(), storage.nbytes())
                    seen.append((name, str(t.dtype), int(t.numel()), *where))
                else:
                    seen.append((name, "object", 0, 0, 0))
            return fn(*args, **kwargs)

        return wrapper

    for owner, name, fn in originals:
        setattr(owner, name, wrap(name, fn))
    try:
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


# -- one run ------------------------------------------------------------------------------


def accumulate(
    model: torch.nn.Module,
    cp: Cockpit,
    step: int,
    x: torch.Tensor,
    y: torch.Tensor,
    opt: torch.optim.Optimizer,
) -> float:
    """One step over two micro-batches of the local batch; the local mean loss."""
    total = 0.0
    with cp(step, info={"batch_size": len(x), "optimizer": opt}, accumulate=True) as step_run:
        for part in (slice(0, len(x) // 2), slice(len(x) // 2, len(x))):
            out = model(x[part])
            share = (part.stop - part.start) / len(x)
            loss = torch.nn.functional.cross_entropy(out, y[part]) * share
            per_sample = torch.nn.functional.cross_entropy(out, y[part], reduction="none")
            info = {"loss": loss, "individual_losses": per_sample.detach(), "batch_size": len(out)}
            with step_run.micro_batch(info):
                loss.backward()
            total += float(loss.detach())
    return total


def run(rank: int, how: str, sizes: tuple[int, int], out_dir: Path) -> dict[str, Any]:
    model = make_model()
    cp = Cockpit(model, "economy") if how == "late" else None  # tracks what fully_shard replaces
    for block in model.blocks:  # no_reshard: the blocks stay gathered from forward to backward
        fully_shard(block, reshard_after_forward=how != "no_reshard")
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    if how == "no_reshard":
        cp = Cockpit(model, quantities())
    elif how == "accumulate":
        cp = Cockpit(model, ["loss", "grad_hist_1d", ShardGradNorm(), ShardMeanGSNR()])
    elif how == "flaky":
        cp = Cockpit(model, ["loss", ShardFlaky(), ShardGradNorm()])
    elif how == "exact":
        log = out_dir / "exact.jsonl" if sizes == SIZES[0] else None
        cp = Cockpit(model, quantities(), log=log)
    elif how == "off":
        cp = Cockpit(model, "economy", distributed="off")
    elif how == "raise":
        cp = Cockpit(model, "economy", on_error="raise")
    lo = sum(sizes[:rank])
    losses, raised = [], []
    seen: list[tuple[str, str, int, int, int]] = []
    with warnings.catch_warnings(record=True) as caught, spy(seen):
        warnings.simplefilter("always", CockpitWarning)
        for step in range(STEPS):
            x, y = batch(step)
            x, y = x[lo : lo + sizes[rank]], y[lo : lo + sizes[rank]]
            opt.zero_grad()
            if how == "accumulate":
                assert cp is not None
                losses.append(accumulate(model, cp, step, x, y, opt))
                opt.step()
                continue
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            if cp is None:
                loss.backward()
            else:
                per_sample = torch.nn.functional.cross_entropy(out, y, reduction="none")
                info = {
                    "loss": loss,
                    "individual_losses": per_sample.detach(),
                    "batch_size": len(x),
                    "optimizer": opt,
                }
                try:
                    with cp(step, info=info):
                        loss.backward()
                except UnsupportedModelError as err:
                    raised.append(str(err))
            opt.step()
            losses.append(float(loss.detach()))
        report = cp.check(model) if how == "exact" and cp is not None else None
        if cp is not None:
            cp.close()
    return {
        "served": None
        if report is None
        else {name: p.served for p in report.params for name in p.names},
        "names": [name for name, _ in model.named_parameters()],
        "types": sorted({type(p).__name__ for p in model.parameters()}),
        "losses": losses,
        "raised": raised,
        "params": [cast(DTensor, p).to_local().detach().clone() for p in model.parameters()],
        "errors": [] if cp is None else list(cp.errors),
        "skipped": [] if cp is None else list(cp.skipped),
        "output": {} if cp is None else cp.get_output(),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, CockpitWarning)],
        "gathers": seen,
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
    return {(how, sizes): run(rank, how, sizes, out_dir) for how, sizes in RUNS}


if __name__ == "__main__":
    serve(compute)
