"""Cost of running diagnoses while training (issue 22).

The demo's 64-32-10 MLP on the 8x8 digits (batch 64, SGD with momentum, preset
``economy``, a log file) trained for ``--steps`` steps in two modes, interleaved over
``--repeats`` rounds in one process (plugins imported before the first timed run):

- ``no diagnoses``: ``Cockpit(model, "economy", log=...)``;
- ``all diagnoses``: the same with ``diagnoses=[every installed rule]``.

Reported: the training loop's wall-clock and CPU time, their ratio, and the diagnoses'
share per tracked step. Writes ``benchmarks/results/diagnoses_online.md``::

    .venv/bin/python benchmarks/diagnoses_online.py [--repeats 3] [--steps 300] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from cockpit_demo.training import load_digits_tensors, make_model

from cockpit_core import Cockpit
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing.problems import prepared

RESULTS = Path(__file__).resolve().parent / "results" / "diagnoses_online.md"
MODES = ("no diagnoses", "all diagnoses")


def run(mode: str, steps: int, folder: Path, data, rules: list[str]) -> dict[str, float]:
    """Train ``steps`` steps in ``mode``; return the loop's wall-clock and CPU seconds."""
    x, y = data
    torch.manual_seed(0)
    model = prepared(make_model())
    loss_fn = prepared(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    diagnoses = rules if mode == "all diagnoses" else None
    cp = Cockpit(model, "economy", log=folder / "log.jsonl", diagnoses=diagnoses)
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # findings are warnings; printing them is not measured
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
    return {"loop": loop, "cpu": loop_cpu, "findings": len(cp.findings)}


def main() -> None:
    """Run the modes interleaved and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of training")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = load_digits_tensors()
    rules = sorted(name for name, _ in default_registry().diagnoses.items())
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        run(MODES[1], 5, Path(tmp), data, rules)  # warm-up: plugins, first compilations
        rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            for mode in MODES:
                folder = Path(tmp) / f"{repeat}-{MODES.index(mode)}"
                folder.mkdir()
                rows[mode].append(run(mode, args.steps, folder, data, rules))
                print(mode, rows[mode][-1], flush=True)
    load.append(os.getloadavg()[0])
    base = statistics.median(r["loop"] for r in rows[MODES[0]])
    base_cpu = statistics.median(r["cpu"] for r in rows[MODES[0]])
    lines = [
        "# Cost of diagnoses while training (issue 22)",
        "",
        f"`benchmarks/diagnoses_online.py --repeats {args.repeats} --steps {args.steps} "
        f"--threads {args.threads}`, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__}. Load average (1 min) {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end. A 64-32-10 MLP on the 8x8 digits, batch 64, SGD with "
        f"momentum, preset `economy` at every step, {args.steps} steps, a log file, "
        f"{args.threads} torch thread(s); medians of {args.repeats} interleaved rounds. "
        f"Rules: {', '.join(rules)}.",
        "",
        "| mode | training loop (s) | vs. no diagnoses | CPU time (s) | vs. no diagnoses "
        "| per step (ms) | findings |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        loop = statistics.median(r["loop"] for r in rows[mode])
        cpu = statistics.median(r["cpu"] for r in rows[mode])
        findings = statistics.median(r["findings"] for r in rows[mode])
        lines.append(
            f"| {mode} | {loop:.2f} | {loop / base:.2f}x | {cpu:.2f} | {cpu / base_cpu:.2f}x "
            f"| {1e3 * loop / args.steps:.2f} | {findings:.0f} |"
        )
    lines += [
        "",
        "`per step`: the training loop's wall-clock time over the steps. The diagnoses see "
        "every record, keep the latest 500 tracked steps of what they read, and check the "
        "whole window after every `len(window) // 20` new steps "
        "(`cockpit_core.diagnosing.runner.CHECKS_PER_WINDOW`; every step while the window is "
        "short, every 25th at 500), and once more at `cp.close()` (not in the loop's time). "
        "`findings`: what they reported on this (healthy) run: the `economy` preset at every "
        "step on this tiny model costs more than the `cost` rule's default budget, and the "
        "others are the rules' judgement of plain SGD at batch 64.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"written {RESULTS}")


if __name__ == "__main__":
    main()
