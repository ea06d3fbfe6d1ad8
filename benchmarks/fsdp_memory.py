"""Issue 33: peak memory per process of cockpit under FSDP2 (``fully_shard``) vs plain FSDP.

A transformer of ``BLOCKS`` encoder blocks (width ``D_MODEL``, float32) and a linear head,
each block and the root under ``fully_shard``, trains for ``STEPS`` steps in 2 gloo
processes on 127.0.0.1 (one thread each), each on its own local batch of ``LOCAL_BATCH``
sequences, SGD with momentum. Modes, each in fresh processes:

* ``plain``: FSDP without cockpit;
* ``economy``: ``Cockpit(model, "economy")`` tracking every step (``alpha`` is refused
  under FSDP at every step: its errors are counted, not hidden);
* ``economy-no-alpha``: ``economy`` without ``alpha`` (refused under FSDP, but it costs
  memory: see the report);
* ``economy-no-alpha+gsnr``: that and ``mean_gsnr``, whose ``SUM_GRAD_SQUARED`` statistic
  is held at each layer's full (unsharded) size until the step ends (the known limitation
  of ``docs/distributed.md``);
* ``only:Q1+Q2``: just those quantities (default: ``only:inner_test``, ``only:alpha``),
  to see where the memory goes;
* ``single-plain``, ``single-economy``: one process, no sharding, the global batch
  (``2 x LOCAL_BATCH``): the "whole model" reference.

Memory is resident memory (RSS). Before the loop each process resets its peak
(``/proc/self/clear_refs`` ``5``, which resets ``VmHWM``), then at every step records RSS
at the step's start (``/proc/self/statm``) and the step's peak (``VmHWM``, reset again at
the step's start). Reported: ``loop growth`` (the loop's peak minus RSS before the first
step: gradients, optimizer state, gathered weights, activations, cockpit) and ``step
transient`` (the largest peak of a step after the first, minus RSS at its start: what a
step allocates and frees again). glibc's dynamic mmap threshold is fixed
(``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave RSS and the peaks follow live
memory. Also per process: its shard's parameter bytes, the largest ``fully_shard`` unit's
unsharded bytes and its per-sample blocks (``LOCAL_BATCH`` x unit x 4 bytes), and the same
for the largest module with parameters (the unit of cockpit's module hooks).

Run ``.venv/bin/python benchmarks/fsdp_memory.py`` (about 3 minutes on 2 cores); it writes
``results/fsdp_memory.{json,md}`` (``--name`` renames). A child is ``python fsdp_memory.py
--child MODE RANK WORLD PORT``; it prints ``@@RESULT@@ {json}`` last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

RESULT = "@@RESULT@@"
HERE = Path(__file__).resolve().parent
BLOCKS, D_MODEL, HEADS, FF, SEQ_LEN, CLASSES = 6, 384, 6, 4 * 384, 16, 10
LOCAL_BATCH, WORLD, STEPS = 4, 2, 6
MODES = (
    "plain",
    "economy",
    "economy-no-alpha",
    "only:inner_test",
    "only:alpha",
    "economy-no-alpha+gsnr",
    "single-plain",
    "single-economy",
)
READING = "## Reading"
"""The hand-written part of the Markdown report below this heading is kept on a rerun."""
MIB = 2**20
MMAP_THRESHOLD = 128 * 1024
"""glibc's default initial mmap threshold, fixed (no dynamic raise after frees)."""


# -- memory of this process ----------------------------------------------------------------


def _rss() -> int:
    """Resident bytes now (``/proc/self/statm``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """Peak resident bytes since the last :func:`_reset_peak` (``VmHWM``)."""
    status = Path("/proc/self/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert match is not None, "no VmHWM in /proc/self/status"
    return int(match.group(1)) * 1024


def _reset_peak() -> None:
    """Set ``VmHWM`` to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


# -- the model ------------------------------------------------------------------------------


class Blocks(torch.nn.Module):
    """``BLOCKS`` pre-norm encoder blocks and a linear head on the mean over the sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(
                D_MODEL, HEADS, FF, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(BLOCKS)
        )
        self.head = torch.nn.Linear(D_MODEL, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def _bytes(module: torch.nn.Module, recurse: bool = True) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters(recurse=recurse))


def _sizes(model: Blocks) -> dict[str, Any]:
    """Unsharded parameter bytes: the model, its largest unit and largest module."""
    units = {f"blocks.{i}": _bytes(b) for i, b in enumerate(model.blocks)}
    units["(root)"] = _bytes(model) - sum(units.values())
    modules = {
        name: _bytes(m, recurse=False)
        for name, m in model.named_modules()
        if any(True for _ in m.parameters(recurse=False))
    }
    unit = max(units, key=units.__getitem__)
    module = max(modules, key=modules.__getitem__)
    return {
        "model_bytes": _bytes(model),
        "params": sum(p.numel() for p in model.parameters()),
        "unit": unit,
        "unit_bytes": units[unit],
        "module": module,
        "module_bytes": modules[module],
    }


def _batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, SEQ_LEN, D_MODEL, generator=gen)
    y = torch.randint(0, CLASSES, (size,), generator=gen)
    return x, y


# -- one process (child) --------------------------------------------------------------------


def child(mode: str, rank: int, world: int, port: int) -> dict[str, Any]:
    """Train ``STEPS`` steps in ``mode``; memory and what cockpit recorded."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from cockpit_core import Cockpit, default_registry

    torch.set_num_threads(1)
    single = mode.startswith("single")
    if not single:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=120),
        )
    torch.manual_seed(0)
    model = Blocks()
    sizes = _sizes(model)
    if not single:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    shard_bytes = sum(t.numel() * t.element_size() for t in local)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    cp = None
    if mode in ("economy", "single-economy"):
        cp = Cockpit(model, "economy")
    elif mode == "economy-no-alpha":
        economy = default_registry().presets["economy"].quantities
        cp = Cockpit(model, [q for q in economy if q != "alpha"])
    elif mode == "economy-no-alpha+gsnr":
        economy = default_registry().presets["economy"].quantities
        cp = Cockpit(model, [*(q for q in economy if q != "alpha"), "mean_gsnr"])
    elif mode.startswith(("only:", "single-only:")):  # one quantity: where the memory goes
        cp = Cockpit(model, mode.split(":", 1)[1].split("+"))
    batch_size = LOCAL_BATCH * (world if single else 1)
    rss_before = _rss()
    _reset_peak()
    starts, peaks, times = [], [], []
    for step in range(STEPS):
        x, y = _batch(step, 0 if single else rank, batch_size)
        starts.append(_rss())
        _reset_peak()
        start = time.perf_counter()
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        if cp is None:
            loss.backward()
        else:
            per_sample = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
            info = {
                "loss": loss,
                "individual_losses": per_sample,
                "batch_size": len(x),
                "optimizer": opt,
            }
            with cp(step, info=info):
                loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        peaks.append(_hwm())
    errors = [] if cp is None else list(cp.errors)
    if cp is not None:
        cp.close()
    if not single:
        dist.destroy_process_group()
    return {
        **sizes,
        "mode": mode,
        "rank": rank,
        "batch_size": batch_size,
        "shard_bytes": shard_bytes,
        "rss_before": rss_before,
        "step_start_rss": starts,
        "step_peak_rss": peaks,
        "loop_growth": max(peaks) - rss_before,
        "step_transient": max(p - s for p, s in zip(peaks[1:], starts[1:])),
        "step_s": statistics.median(times[1:]),
        "errors": len(errors),
        "errors_by_quantity": dict(Counter(str(e.get("quantity")) for e in errors)),
        "error_example": {
            str(e.get("quantity")): str(e.get("message", ""))[:200] for e in reversed(errors)
        },
    }


# -- the comparison (parent) ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def launch(mode: str, timeout: float) -> list[dict[str, Any]]:
    """Run ``mode`` in fresh processes (2 ranks, or 1 for ``single-*``); their results."""
    world = 1 if mode.startswith("single") else WORLD
    port = str(_free_port())
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    }
    script = str(Path(__file__).resolve())
    procs = [
        subprocess.Popen(
            [sys.executable, script, "--child", mode, str(r), str(world), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    results = []
    try:
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=timeout)
            lines = [line for line in out.splitlines() if line.startswith(RESULT)]
            if p.returncode != 0 or not lines:
                results.append({"mode": mode, "rank": r, "failed": out[-3000:]})
            else:
                results.append(json.loads(lines[-1][len(RESULT) :]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def _base(run: dict[str, Any], ok: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The plain run to compare ``run`` with: same rank, sharded or not alike."""
    name = "single-plain" if run["mode"].startswith("single") else "plain"
    if run["mode"] == name:
        return None
    return next((r for r in ok if r["mode"] == name and r["rank"] == run["rank"]), None)


def markdown(runs: list[dict[str, Any]], meta: dict[str, Any], reading: str = "") -> str:
    """The per-process table: growth, extra over plain, and the bounds; then ``reading``."""
    ok = [r for r in runs if "failed" not in r]
    first = ok[0]
    unit, module, b, whole = (
        first["unit_bytes"],
        first["module_bytes"],
        LOCAL_BATCH,
        first["model_bytes"],
    )
    bound = unit + b * unit
    lines = [
        "# Peak memory per process under FSDP2: cockpit vs plain FSDP (issue 33)",
        "",
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}. Model: {BLOCKS} pre-norm "
        f"`nn.TransformerEncoderLayer` blocks (d {D_MODEL}, {HEADS} heads, feed-forward "
        f"{FF}) and a linear head, float32, {first['params']:,} parameters "
        f"({_mb(whole)} MiB unsharded); every block and the root under `fully_shard` "
        f"(`reshard_after_forward=True`), {WORLD} gloo processes on 127.0.0.1, one thread "
        f"each, local batch {b} x {SEQ_LEN} x {D_MODEL}, SGD with momentum, {STEPS} steps "
        f"(every step tracked). `single-*`: one process, unsharded, batch {WORLD * b}. "
        f"Load average before/after: {meta['load_before']} / {meta['load_after']} "
        "(other engineers' tests share the 2 cores: the step times depend on it, the "
        "memory does not).",
        "",
        f"Sizes (unsharded, float32): largest `fully_shard` unit `{first['unit']}` "
        f"{_mb(unit)} MiB, its per-sample blocks ({b} x unit) {_mb(b * unit)} MiB; largest "
        f"module with parameters `{first['module']}` {_mb(module)} MiB, its per-sample "
        f"blocks {_mb(b * module)} MiB. **Bound** on cockpit's extra peak per process: one "
        f"unit's unsharded weights and its per-sample blocks, {_mb(bound)} MiB (on top of "
        "plain FSDP, which holds the shard, its gradient and momentum, gathered units and "
        "activations).",
        "",
        "MiB per process. `loop growth`: the training loop's peak RSS minus RSS before it; "
        "`step transient`: the largest (step's peak - RSS at its start) after the first "
        "step; `extra`: minus the same rank's plain run (`single-*`: minus `single-plain`).",
        "",
        "| mode | rank | shard | RSS before loop | loop growth | x plain | extra | extra / "
        "bound | extra / whole model | step transient | extra transient | step (s) | "
        "cockpit errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ok:
        base = _base(r, ok)
        ratio = extra = extra_t = None
        if base is not None:
            ratio = r["loop_growth"] / base["loop_growth"]
            extra = r["loop_growth"] - base["loop_growth"]
            extra_t = r["step_transient"] - base["step_transient"]
        errors = ", ".join(f"{q} {n}" for q, n in sorted(r["errors_by_quantity"].items()))
        lines.append(
            f"| {r['mode']} | {r['rank']} | {_mb(r['shard_bytes'])} | {_mb(r['rss_before'])} "
            f"| {_mb(r['loop_growth'])} | {'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{_mb(extra)} | {'-' if extra is None else f'{extra / bound:.2f}'} | "
            f"{'-' if extra is None else f'{extra / whole:.2f}'} | "
            f"{_mb(r['step_transient'])} | {_mb(extra_t)} | {r['step_s']:.2f} | "
            f"{r['errors']}{' (' + errors + ')' if errors else ''} |"
        )
    for r in runs:
        if "failed" in r:
            lines.append(f"| {r['mode']} | {r['rank']} | failed | | | | | | | | | | |")
    text = "\n".join(lines) + "\n"
    return text + ("\n" + reading if reading else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=4, metavar=("MODE", "RANK", "WORLD", "PORT"))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--name", default="fsdp_memory")
    parser.add_argument("--output-dir", type=Path, default=HERE / "results")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.child:
        mode, rank, world, port = args.child
        print(RESULT, json.dumps(child(mode, int(rank), int(world), int(port))), flush=True)
        return 0
    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "load_before": _load(),
    }
    runs: list[dict[str, Any]] = []
    for mode in args.modes.split(","):
        started = time.perf_counter()
        runs.extend(launch(mode, args.timeout))
        print(f"{mode}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    meta["load_after"] = _load()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "blocks": BLOCKS,
        "d_model": D_MODEL,
        "heads": HEADS,
        "ff": FF,
        "seq_len": SEQ_LEN,
        "local_batch": LOCAL_BATCH,
        "world": WORLD,
        "steps": STEPS,
        "mmap_threshold": MMAP_THRESHOLD,
    }
    data = {"meta": meta, "config": config, "runs": runs}
    (args.output_dir / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    report = args.output_dir / f"{args.name}.md"
    old = report.read_text() if report.exists() else ""
    text = markdown(runs, meta, old[old.index(READING) :] if READING in old else "")
    report.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
