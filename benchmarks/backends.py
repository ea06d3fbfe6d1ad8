"""Speed and peak memory of the two per-sample statistics paths: BackPACK and torch.func.

For each problem (an MLP and a 3c3d-style CNN, where both paths work) it runs, each in a
fresh process: plain training, and training with first-order quantities (``norm_test``
[batch_l2], ``mean_gsnr`` [sum_grad_squared], ``inner_test`` [batch_dot] tracked at every
step) with ``backend="backpack"`` and ``backend="func"`` (optionally with a ``chunk_size``).
It reports the median step time, its ratio to plain training measured in the same run, the
peak resident memory, and the largest relative difference of the tracked values between
the two paths at the first step. Writes ``benchmarks/results/backends.md``::

    .venv/bin/python benchmarks/backends.py [--steps 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

QUANTITIES = ["norm_test", "mean_gsnr", "inner_test"]
CONFIGS = [
    ("plain", None, None),
    ("backpack", "backpack", None),
    ("func", "func", None),
    ("func, chunk_size=32", "func", 32),
]


def build(problem: str):
    """Model, a batch and the per-sample loss of ``problem`` (fixed seed)."""
    import torch
    from cockpit_backpack import extend

    torch.manual_seed(0)
    if problem == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        )
        x, batch = torch.randn(128, 1, 28, 28), 128
    else:  # 3c3d-style CNN on 3x32x32 inputs, slimmed down
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 5),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, 2),
            torch.nn.Conv2d(16, 32, 3),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, 2),
            torch.nn.Flatten(),
            torch.nn.Linear(32 * 5 * 5, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 10),
        )
        x, batch = torch.randn(64, 3, 32, 32), 64
    y = torch.randint(0, 10, (batch,))
    return extend(model), x, y


def child(problem: str, backend: str | None, chunk_size: int | None, steps: int) -> dict:
    """One measured run; returns median step time, peak RSS and the first step's values."""
    import torch
    from cockpit_backpack import extend

    from cockpit_core import Cockpit

    model, x, y = build(problem)
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = None
    if backend is not None:
        cp = Cockpit(model.named_parameters(), QUANTITIES, backend=backend, chunk_size=chunk_size)
        cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if cp is None:
            loss.backward()
        else:
            info = {"loss": loss, "batch_size": len(x), "inputs": x, "targets": y}
            with cp(step, info=info):
                loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    times = sorted(times[2:])  # the first steps warm up
    values = {}
    if cp is not None:
        values = {k: float(v["total"]) for k, v in cp.get_output()[0].items()}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"median_s": times[len(times) // 2], "peak_mib": peak_kib / 1024, "values": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--problems", default="mlp,cnn")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        problem, backend, chunk = json.loads(args.child)
        print(json.dumps(child(problem, backend, chunk, args.steps)))
        return
    rows = []
    for problem in args.problems.split(","):
        results = {}
        for label, backend, chunk in CONFIGS:
            spec = json.dumps([problem, backend, chunk])
            cmd = [sys.executable, __file__, "--child", spec, "--steps", str(args.steps)]
            cmd += ["--threads", str(args.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[label] = json.loads(out.stdout.strip().splitlines()[-1])
        plain = results["plain"]
        ref = results["backpack"]["values"]
        for label, _, _ in CONFIGS:
            r = results[label]
            diff = (
                max(
                    (abs(r["values"][k] - v) / max(abs(v), 1e-30) for k, v in ref.items()),
                    default=float("nan"),
                )
                if r["values"]
                else float("nan")
            )
            rows.append(
                f"| {problem} | {label} | {1e3 * r['median_s']:.1f} | "
                f"{r['median_s'] / plain['median_s']:.2f}x | {r['peak_mib']:.0f} | "
                f"{r['peak_mib'] - plain['peak_mib']:+.0f} | "
                + ("" if label == "plain" else f"{diff:.1e}")
                + " |"
            )
    load = os.getloadavg()[0]
    text = "\n".join(
        [
            "# Per-sample statistics: BackPACK vs torch.func",
            "",
            f"`benchmarks/backends.py`, {args.steps} steps (median of the last "
            f"{args.steps - 2}), {args.threads} threads, quantities {', '.join(QUANTITIES)} "
            f"at every step; load average at the end: {load:.1f} (other processes share the "
            "CPU, so times are noisy). Peak memory is the process's peak resident set "
            "(includes ~300 MB of torch itself); the column after it is the increase over "
            "plain training. 'max rel. diff' compares the first step's values with the "
            "BackPACK path.",
            "",
            "| problem | path | step (ms) | vs plain | peak RSS (MiB) | vs plain (MiB) | "
            "max rel. diff |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    path = Path(__file__).parent / "results" / "backends.md"
    path.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
