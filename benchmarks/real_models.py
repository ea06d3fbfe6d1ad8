"""Issue 28: ``economy`` on the models people train, against plain training in the same run.

Three models as practitioners write them (``cockpit_core.testing.models``): a tiny
``transformers`` GPT-2 (``Conv1D``, tied head, positions ``[1, T]``), a nanoGPT (tied
weights, ``wpe(arange(T))``, its own LayerNorm class) and a ViT (bare ``cls``/``pos``
parameters). Each configuration trains in a fresh process; plain and tracked processes
alternate, and the ratios are of medians over repeats. Recorded per configuration: the
median step time, and the peak resident memory of the training loop (the process's peak
RSS minus its RSS before the first step; the model, data and imports are the same in both).

Modes:

* ``plain``: training without cockpit;
* ``economy``: ``Cockpit(model, "economy")``, every step tracked, nothing attached;
* ``economy-attach``: the same with ``cp.attach(model, loss_fn)`` and the batch in
  ``info`` (the only way to get every statistic before issue 28: ``torch.func``);
* ``health``, ``health@10``: the ``health`` preset (issue 31), every step or every 10th
  (not in the default modes: ``--modes plain,health,health@10``);
* ``plain-compiled``, ``economy-compiled``: the model under ``torch.compile`` (inductor),
  ``economy`` every 10th step; ``economy-compiled`` interleaves bare compiled steps
  (without cockpit) with the Cockpit's steps in the same process, and its untracked steps
  are compared with those (target: within 5%); its tracked steps with uncompiled tracked
  steps.

Run ``.venv/bin/python benchmarks/real_models.py`` on a quiet machine (nothing else
running); ``--repeats``, ``--models``, ``--modes`` narrow it. It writes
``results/real_models.{json,md}`` (``--name`` changes the file name). A child is
``python real_models.py --child SPEC_JSON``; it prints ``@@RESULT@@ {json}`` last.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from overhead_problems import REAL_MODELS, REAL_SIZES, real_model_problem

RESULT = "@@RESULT@@"
HERE = Path(__file__).resolve().parent
MODELS = REAL_MODELS
MODES = ("plain", "economy", "economy-attach", "plain-compiled", "economy-compiled")
HEALTH_MODES = ("health", "health@10")  # issue 31: run with --modes plain,health,health@10
BATCHES = 4  # distinct synthetic batches, cycled


def _rss_mb() -> float:
    """Resident memory now (``/proc/self/statm``), MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# -- one run (child process) ---------------------------------------------------------------


SIZES = REAL_SIZES
"""Model sizes (``overhead_problems.REAL_SIZES``): ``small`` steps take ~10 ms plain on 2 CPU
threads, ``medium`` ~10x that."""


def _problem(name: str, size: str = "small"):
    """``(model, batches, losses_fn)`` with ``losses_fn(model, batch) -> [B]``.

    The model, batches and per-sample losses of ``overhead_problems.real_model_problem`` (the
    overhead harness trains the same ``small`` problems); batches are ``(inputs, targets)``,
    a language model's targets its inputs.
    """
    import torch

    problem = real_model_problem(name, size)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = problem.make_model()
    batches = [problem.make_batch(gen) for _ in range(BATCHES)]
    return model, batches, problem.losses


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one configuration; step times and memory."""
    import torch

    torch.set_num_threads(spec["threads"])
    model, batches, losses_fn = _problem(spec["model"], spec.get("size", "small"))
    mode = spec["mode"]
    compiled = mode.endswith("-compiled")
    every = 10 if compiled or mode.endswith("@10") else 1
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = None
    if mode.startswith(("economy", "health")):
        from cockpit_core import Cockpit, default_registry

        preset = default_registry().presets[mode.split("-")[0].split("@")[0]].quantities
        cp = Cockpit(model, [{"name": name, "every": every} for name in preset])
        if mode == "economy-attach":
            cp.attach(model, _per_sample_loss(spec["model"]))
    rss_before = _rss_mb()
    # economy-compiled interleaves bare compiled steps (no cockpit) with the Cockpit's steps
    # in the same process: untracked steps are compared with those, free of process noise
    interleave = mode == "economy-compiled"
    times, kinds = [], []  # kind: "tracked", "untracked" or "bare"
    cp_step = 0
    for step in range(spec["warmup"] + spec["steps"] * (2 if interleave else 1)):
        batch = batches[step % BATCHES]
        bare = cp is None or (interleave and step % 2 == 1)
        start = time.perf_counter()
        opt.zero_grad()
        losses = losses_fn(forward, batch)
        loss = losses.mean()
        if bare:
            loss.backward()
        else:
            info = {
                "loss": loss,
                "individual_losses": losses.detach(),
                "batch_size": len(batch[0]),
                "optimizer": opt,
            }
            if mode == "economy-attach":  # the batch, for torch.func
                info["inputs"] = batch[0]
                info["targets"] = batch[-1]
            with cp(cp_step, info=info):
                loss.backward(retain_graph=cp.retain_graph(cp_step))
        opt.step()
        if step >= spec["warmup"]:
            times.append(time.perf_counter() - start)
            # alpha (two-step) also runs at the step after a scheduled one: tracked too
            tracked = every == 1 or cp_step % every in (0, 1)
            kinds.append("bare" if bare else "tracked" if tracked else "untracked")
        if not bare:
            cp_step += 1

    def median(kind: str) -> float | None:
        values = [t for t, k in zip(times, kinds) if k == kind]
        return 1e3 * statistics.median(values) if values else None

    return {
        "median_ms": 1e3 * statistics.median(times),
        "mean_ms": 1e3 * statistics.fmean(times),
        "tracked_ms": median("tracked"),
        "untracked_ms": median("untracked"),
        "bare_ms": median("bare") if interleave else None,
        "peak_rss_mb": _peak_rss_mb(),
        "train_peak_mb": _peak_rss_mb() - rss_before,
        "errors": len(cp.errors) if cp is not None else 0,
        "params": sum(p.numel() for p in model.parameters()),
    }


def _per_sample_loss(model: str):
    """``loss_fn(outputs, targets)`` for ``cp.attach``: per-sample losses of a model's outputs."""
    return real_model_problem(model).per_sample


# -- the comparison (parent process) ----------------------------------------------------------


def _run(spec: dict[str, Any], python: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [python, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    return {"error": (proc.stderr or proc.stdout)[-2000:]}


def _ratios(results: dict[str, dict[str, list[dict]]]) -> list[dict[str, Any]]:
    """Per model and mode: medians over repeats, and ratios to plain (compiled to compiled)."""
    rows = []
    for model, modes in results.items():

        def median(mode: str, key: str, modes: dict = modes) -> float | None:
            values = [r[key] for r in modes.get(mode, []) if r.get(key) is not None]
            return statistics.median(values) if values else None

        for mode in modes:
            base = "plain-compiled" if mode.endswith("-compiled") else "plain"
            row = {
                "model": model,
                "mode": mode,
                # every 10th step tracked: the mean step counts the tracked ones
                "step_ms": median(mode, "mean_ms" if mode.endswith("@10") else "median_ms"),
                "train_peak_mb": median(mode, "train_peak_mb"),
                "peak_rss_mb": median(mode, "peak_rss_mb"),
                "errors": max((r.get("errors", 0) for r in modes[mode]), default=0),
                "failed": sum(1 for r in modes[mode] if "error" in r),
            }
            plain_key = "mean_ms" if mode.endswith("@10") else "median_ms"
            plain_ms, plain_mb = median(base, plain_key), median(base, "train_peak_mb")
            if mode != base and plain_ms and row["step_ms"]:
                row["time_ratio"] = row["step_ms"] / plain_ms
                if plain_mb and row["train_peak_mb"] is not None:
                    row["memory_ratio"] = row["train_peak_mb"] / plain_mb
                    row["rss_ratio"] = row["peak_rss_mb"] / median(base, "peak_rss_mb")
            if mode == "economy-compiled":  # against the bare steps of the same processes
                ratios = [
                    r["untracked_ms"] / r["bare_ms"]
                    for r in modes[mode]
                    if r.get("untracked_ms") and r.get("bare_ms")
                ]
                row["untracked_ratio"] = statistics.median(ratios) if ratios else None
                eager = median("economy", "median_ms")
                tracked = median(mode, "tracked_ms")
                row["tracked_vs_eager"] = tracked / eager if tracked and eager else None
            rows.append(row)
    return rows


def _markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    def f(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        "# economy on the models people train (issue 28)",
        "",
        f"Size `{meta['size']}`, {meta['threads']} threads, {meta['repeats']} fresh processes "
        "per configuration "
        f"(plain and tracked alternating), {meta['steps']} measured steps after "
        f"{meta['warmup']} warm-up steps; load average before/after: {meta['load']}.",
        "",
        "| model | mode | step (ms) | x plain | train peak (MB) | x plain | peak RSS x plain "
        "| untracked x bare compiled (same process) | tracked x eager economy | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['mode']} | {f(r['step_ms'], '.1f')} | "
            f"{f(r.get('time_ratio'), '.2f')} | {f(r['train_peak_mb'], '.0f')} | "
            f"{f(r.get('memory_ratio'), '.2f')} | {f(r.get('rss_ratio'), '.2f')} | "
            f"{f(r.get('untracked_ratio'), '.3f')} | {f(r.get('tracked_vs_eager'), '.2f')} | "
            f"{r['errors']}{' (' + str(r['failed']) + ' runs failed)' if r['failed'] else ''} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--name", default="real_models")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the runs")
    args = parser.parse_args(argv)
    if args.child:
        print(RESULT, json.dumps(child(json.loads(args.child))))
        return 0
    models, modes = args.models.split(","), args.modes.split(",")
    env = dict(os.environ)
    results: dict[str, dict[str, list[dict]]] = {m: {mode: [] for mode in modes} for m in models}
    load_before = os.getloadavg()[0]
    for repeat in range(args.repeats):
        for model in models:
            for mode in modes:  # plain and tracked alternate within each repeat
                spec = {
                    "model": model,
                    "mode": mode,
                    "threads": args.threads,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "size": args.size,
                }
                result = _run(spec, args.python, env)
                results[model][mode].append(result)
                shown = result.get("median_ms", result.get("error", "")[-300:])
                print(f"[{repeat}] {model} {mode}: {shown}", flush=True)
    meta = {
        "size": args.size,
        "threads": args.threads,
        "repeats": args.repeats,
        "steps": args.steps,
        "warmup": args.warmup,
        "load": f"{load_before:.2f}/{os.getloadavg()[0]:.2f}",
    }
    rows = _ratios(results)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "runs": results, "rows": rows}, indent=1)
    )
    (out / f"{args.name}.md").write_text(_markdown(rows, meta))
    print(_markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
