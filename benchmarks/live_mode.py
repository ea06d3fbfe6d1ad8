"""Cost of live mode in the training process (issue 20).

A 20-step run of the demo's 64-32-10 MLP on the 8x8 digits (batch 64, SGD with momentum,
preset ``economy``, a log file) in three modes, interleaved over ``--repeats`` rounds in
one process (plugins and matplotlib imported before the first timed run), training on
``--threads`` torch threads (default 1, so that on a 2-core machine the renderer has a core
of its own, as it has on any machine with a spare core):

- ``no live plot``: the log only;
- ``live_every=5, inline``: ``LivePlot(every=5)``, each picture drawn in the training process
  (what ``Cockpit(live_plot=..., live_every=5)`` did before issue 20);
- ``live_every=5, background``: ``LivePlot(every=5, background=True)``, the pictures drawn by
  a forked renderer process.

For each mode: the training loop's wall-clock time (20 steps, what training waits for), the
training process's own CPU time in it, ``cp.close()`` (the last picture; in background mode
the wait for the renderer) and the pictures drawn. ``cockpit serve`` costs the training
process nothing: it only reads the log in another process. Writes ``benchmarks/results/live_mode.md``::

    .venv/bin/python benchmarks/live_mode.py [--repeats 3] [--steps 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from cockpit_dashboard import LivePlot
from cockpit_demo.training import load_digits_tensors, make_model

from cockpit_core import Cockpit
from cockpit_core.testing.problems import prepared

RESULTS = Path(__file__).resolve().parent / "results" / "live_mode.md"
MODES = ("no live plot", "live_every=5, inline", "live_every=5, background")


def run(mode: str, steps: int, folder: Path, data) -> dict[str, float]:
    x, y = data
    torch.manual_seed(0)
    model = prepared(make_model())
    loss_fn = prepared(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sinks = []
    if mode != "no live plot":
        sinks.append(LivePlot(folder / "live.png", every=5, background="background" in mode))
    cp = Cockpit(model, "economy", log=folder / "log.jsonl", sinks=sinks)
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        idx = torch.arange(step * 64, (step + 1) * 64) % len(x)
        opt.zero_grad()
        outputs = model(x[idx])
        loss = loss_fn(outputs, y[idx])
        losses = F.cross_entropy(outputs, y[idx], reduction="none").detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": 64, "optimizer": opt}
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    loop, loop_cpu = time.perf_counter() - start, time.process_time() - cpu
    cp.close()
    closed = time.perf_counter() - start - loop
    return {
        "loop": loop,
        "cpu": loop_cpu,
        "close": closed,
        "pictures": sinks[0].renders if sinks else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of training")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = load_digits_tensors()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        run(MODES[1], 1, Path(tmp), data)  # warm-up: plugins, matplotlib, first picture
        rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            for mode in MODES:
                folder = Path(tmp) / f"{repeat}-{MODES.index(mode)}"
                folder.mkdir()
                rows[mode].append(run(mode, args.steps, folder, data))
                print(mode, rows[mode][-1], flush=True)
    load.append(os.getloadavg()[0])
    base = statistics.median(r["loop"] for r in rows[MODES[0]])
    base_cpu = statistics.median(r["cpu"] for r in rows[MODES[0]])
    lines = [
        "# Cost of live mode in the training process (issue 20)",
        "",
        f"`benchmarks/live_mode.py --repeats {args.repeats} --steps {args.steps} --threads "
        f"{args.threads}`, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.platform()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch.__version__}. Load average (1 min) "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end (other processes share the "
        "cores: read the ratios, not the absolute times). A 64-32-10 MLP on the 8x8 digits, "
        f"batch 64, SGD with momentum, preset `economy`, {args.steps} steps, a log file, "
        f"{args.threads} torch thread(s) (the other cores are left to the renderer, as on a "
        f"machine with a spare core); medians of {args.repeats} interleaved rounds.",
        "",
        "| mode | training loop (s) | vs. no live plot | its CPU time (s) | vs. no live plot "
        "| `cp.close()` (s) | pictures |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        loop = statistics.median(r["loop"] for r in rows[mode])
        cpu = statistics.median(r["cpu"] for r in rows[mode])
        close = statistics.median(r["close"] for r in rows[mode])
        pictures = statistics.median(r["pictures"] for r in rows[mode])
        lines.append(
            f"| {mode} | {loop:.2f} | {loop / base:.2f}x | {cpu:.2f} | {cpu / base_cpu:.2f}x "
            f"| {close:.2f} | {pictures:.0f} |"
        )
    lines += [
        "",
        "`training loop`: the 20 steps' wall-clock time, what training waits for; `its CPU "
        "time`: the training process's own (user + system, all its threads, not the "
        "renderer process's), steadier under load. `cp.close()`: the last "
        "picture (inline), or the wait for the renderer process to draw it and end "
        "(background). Background mode draws fewer pictures when requests arrive faster than "
        "it draws: the ones queued meanwhile become one picture of everything so far.",
        "`cockpit serve` is not in the table: it runs in a process of its own and only reads "
        "the log, so the training process pays nothing for it beyond writing the log.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"written {RESULTS}")


if __name__ == "__main__":
    main()
