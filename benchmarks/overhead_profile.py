"""Profile one configuration of the overhead benchmark in this process (issue 7).

Not a benchmark (``overhead.py`` is): it trains the benchmark's problem with a preset or
quantities, times tracked and untracked steps apart, and prints a ``cProfile`` table of
the tracked steps (or a ``torch.profiler`` table with ``--torch``)::

    .venv/bin/python benchmarks/overhead_profile.py --problem cnn --config economy
    .venv/bin/python benchmarks/overhead_profile.py --problem mlp --config economy --steps 200
    .venv/bin/python benchmarks/overhead_profile.py --config economy --every 16 --no-profile
    .venv/bin/python benchmarks/overhead_profile.py --problem tf-small --config first_order

Plain steps (model not extended) run in the same process, alternating with the tracked
ones, so the ratios printed are less sensitive to other processes than separate runs; the
ratio of CPU times (``time.process_time``) is printed too, which is steadier still on a
busy machine, especially with ``--threads 1``.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cockpit_backpack  # noqa: E402
import torch  # noqa: E402
from overhead_child import LEARNING_RATE, N_BATCHES, NOT_EXTENDED, SETS, tracked_step  # noqa: E402
from overhead_problems import PROBLEMS, get_problem  # noqa: E402

import cockpit_core  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Parse the options, train, print timings and a profile."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="cnn", choices=PROBLEMS)
    ap.add_argument(
        "--config", default="economy", help=f"preset, set ({', '.join(SETS)}) or quantities"
    )
    ap.add_argument(
        "--path",
        default="model",
        choices=("model", "backpack"),
        help="Cockpit(model, ...) or Cockpit(model.named_parameters(), ...) (BackPACK only)",
    )
    ap.add_argument("--every", type=int, default=1, help="tracking interval")
    ap.add_argument("--steps", type=int, default=6, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-profile", action="store_true", help="only time the steps")
    ap.add_argument("--torch", action="store_true", help="torch.profiler instead of cProfile")
    ap.add_argument("--top", type=int, default=35, help="rows of the profile table")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    problem = get_problem(args.problem)
    model = problem.make_model()
    plain_model = copy.deepcopy(model)
    loss_fn, plain_loss = problem.loss_module(), problem.loss_module()
    if args.problem not in NOT_EXTENDED:
        model, loss_fn = cockpit_backpack.extend(model), cockpit_backpack.extend(loss_fn)
    gen = torch.Generator().manual_seed(1)
    batches = [problem.make_batch(gen) for _ in range(N_BATCHES)]
    spec = args.config.split(",") if "," in args.config else args.config
    spec = SETS.get(args.config, spec)
    registry = cockpit_core.default_registry()
    quantities = [
        type(q)(q.config.model_copy(update={"every": args.every, "offset": 0, "schedule": None}))
        for q in cockpit_core.resolve_quantities(spec, registry)
    ]
    params = model if args.path == "model" else model.named_parameters()
    cp = cockpit_core.Cockpit(params, quantities=quantities, registry=registry)
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=LEARNING_RATE)

    def plain_step(step: int) -> None:
        x, y = batches[step % N_BATCHES]
        plain_opt.zero_grad()
        plain_loss(plain_model(x), y).backward()
        plain_opt.step()

    def ours_step(step: int) -> None:
        batch = batches[step % N_BATCHES]
        tracked_step(cp, model, loss_fn, opt, batch, step, per_sample=problem.per_sample)

    cpu: dict[str, list[float]] = {"plain": [], "tracked": []}

    def timed(fn, step: int, kind: str | None = None) -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        fn(step)
        if kind is not None:
            cpu[kind].append(time.process_time() - c0)
        return time.perf_counter() - t0

    for step in range(args.warmup):
        plain_step(step)
        ours_step(step)
    plain, tracked, untracked = [], [], []
    profiler = None
    if not args.no_profile:
        profiler = (
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            if args.torch
            else cProfile.Profile()
        )
    total = args.steps * args.every
    for step in range(args.warmup, args.warmup + total):
        plain.append(timed(plain_step, step, "plain"))
        is_tracked = step % args.every == 0
        if is_tracked and profiler is not None:
            profiler.__enter__() if args.torch else profiler.enable()
        t = timed(ours_step, step, "tracked" if is_tracked else None)
        if is_tracked and profiler is not None:
            profiler.__exit__(None, None, None) if args.torch else profiler.disable()
        (tracked if is_tracked else untracked).append(t)
    p = statistics.median(plain)
    print(f"plain     {1e3 * p:9.2f} ms (median of {len(plain)})")
    print(
        f"tracked   {1e3 * statistics.median(tracked):9.2f} ms  {statistics.median(tracked) / p:6.2f}x"
    )
    ratio = statistics.median(cpu["tracked"]) / statistics.median(cpu["plain"])
    print(f"tracked / plain in CPU time (less sensitive to other processes): {ratio:.2f}x")
    if untracked:
        u = statistics.median(untracked)
        print(f"untracked {1e3 * u:9.2f} ms  {u / p:6.2f}x")
        amortized = (sum(tracked) + sum(untracked)) / (len(tracked) + len(untracked))
        print(f"amortized {1e3 * amortized:9.2f} ms  {amortized / statistics.mean(plain):6.2f}x")
    print("errors:", [e["error"] for e in cp.errors][:3])
    if profiler is None:
        return
    if args.torch:
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    else:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
