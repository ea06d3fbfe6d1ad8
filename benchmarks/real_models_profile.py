"""Where a tracked ``economy`` step's time goes on the models of ``real_models.py`` (issue 32).

Not a benchmark of ratios (``real_models.py`` is): it trains one model with ``economy`` at
every step, alternating with plain steps of the same model in the same process, and splits
each tracked step's time above the plain step by timers wrapped around cockpit's own
functions:

* ``enter``: ``with cp(step)`` entering (planning, arming);
* ``per-sample gradients``: the module-hook rules forming each parameter's per-sample
  gradients from the saved inputs and output gradients (inside ``backward``);
* ``reductions``: the per-sample statistics of each parameter, split by the way
  :mod:`cockpit_core.statistics.reduce` computes them (closed forms such as norms and
  projections, element-wise statistics such as the histogram, factored transforms such as
  alpha's end point), inside ``backward``;
* ``quantities``: each quantity's ``compute`` after ``backward`` (from the cost meter);
* ``rest of exit``: gathering, checks and logging after ``backward``;
* ``backward, other``: the backward pass minus the plain backward and the two items
  above (the hooks' capture of inputs and output gradients, autograd's extra work).

Run ``.venv/bin/python benchmarks/real_models_profile.py --model gpt2`` on a quiet machine.
The timers add a few microseconds per call; shares are of the median tracked step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from real_models import MODELS, SIZES, _problem  # noqa: E402

import cockpit_core.statistics.provider as provider  # noqa: E402
import cockpit_core.statistics.reduce as reduce  # noqa: E402
from cockpit_core import Cockpit  # noqa: E402
from cockpit_core.engine.cost import CostMeter  # noqa: E402
from cockpit_core.engine.step import StepRun  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)


def _timed(owner: Any, attr: str, label: str) -> None:
    """Replace ``owner.attr`` by a wrapper adding its time to ``SPENT[label]`` (outermost only).

    A function an older version of cockpit does not have is left out (its row reads 0).
    """
    inner = getattr(owner, attr, None)
    if inner is None:
        return
    depth = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                SPENT[label] += time.perf_counter() - start

    setattr(owner, attr, wrapper)


def _instrument() -> None:
    from cockpit_hooks.provider import HooksProvider

    _timed(StepRun, "__enter__", "enter")
    _timed(StepRun, "__exit__", "exit")
    _timed(HooksProvider, "_per_sample", "backward: per-sample gradients (rules)")
    _timed(reduce, "_elementwise", "backward: element-wise statistics (histogram blocks)")
    _timed(reduce, "_direct", "backward: closed forms and projections")
    _timed(provider, "reduce_per_sample", "backward: all reductions")
    original = CostMeter.quantity

    def quantity(self: CostMeter, key: str, seconds: float) -> None:
        SPENT[f"quantity {key}"] += seconds
        original(self, key, seconds)

    CostMeter.quantity = quantity  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    """Train, time, and print the breakdown of the median tracked step (Markdown)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2", choices=MODELS)
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    _instrument()
    model, batches, losses_fn = _problem(args.model, args.size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = Cockpit(model, "economy")
    plain: list[tuple[float, float]] = []  # (step, backward)
    tracked: list[tuple[float, float, dict[str, float]]] = []
    for step in range(args.warmup + args.steps):
        batch = batches[step % len(batches)]
        for track in (False, True):
            SPENT.clear()
            start = time.perf_counter()
            opt.zero_grad()
            losses = losses_fn(model, batch)
            loss = losses.mean()
            if track:
                info = {
                    "loss": loss,
                    "individual_losses": losses.detach(),
                    "batch_size": len(batch[0]),
                    "optimizer": opt,
                }
                with cp(step, info=info):
                    b0 = time.perf_counter()
                    loss.backward(retain_graph=cp.retain_graph(step))
                    backward = time.perf_counter() - b0
            else:
                b0 = time.perf_counter()
                loss.backward()
                backward = time.perf_counter() - b0
            opt.step()
            total = time.perf_counter() - start
            if step >= args.warmup:
                if track:
                    tracked.append((total, backward, dict(SPENT)))
                else:
                    plain.append((total, backward))
    cp.close()
    print(_report(args, plain, tracked, len(cp.errors)))


def _report(args: Any, plain: list, tracked: list, errors: int) -> str:
    plain_step = statistics.median(t for t, _ in plain)
    plain_backward = statistics.median(b for _, b in plain)

    def med(key: str) -> float:
        return statistics.median(s.get(key, 0.0) for _, _, s in tracked)

    step = statistics.median(t for t, _, _ in tracked)
    backward = statistics.median(b for _, b, _ in tracked)
    rules = med("backward: per-sample gradients (rules)")
    reductions = med("backward: all reductions")
    parts = {
        "enter": med("enter"),
        "backward: per-sample gradients (rules)": rules,
    }
    for key in (
        "backward: closed forms and projections",
        "backward: element-wise statistics (histogram blocks)",
    ):
        parts[key] = med(key)
    parts["backward: factored transforms and the rest of the reductions"] = reductions - sum(
        med(k)
        for k in (
            "backward: closed forms and projections",
            "backward: element-wise statistics (histogram blocks)",
        )
    )
    parts["backward: other (capture, autograd's extra work)"] = (
        backward - plain_backward - rules - reductions
    )
    keys = sorted({k for _, _, s in tracked for k in s if k.startswith("quantity ")})
    quantities = 0.0
    for key in keys:
        parts[key] = med(key)
        quantities += parts[key]
    parts["exit: rest (gathering, checks, log)"] = med("exit") - quantities
    parts["forward and optimizer step, other"] = (
        step - plain_step - sum(v for k, v in parts.items())
    )
    lines = [
        f"### {args.model} ({args.size}), economy at every step",
        "",
        f"Plain step {1e3 * plain_step:.1f} ms (backward {1e3 * plain_backward:.1f} ms); "
        f"tracked step {1e3 * step:.1f} ms ({step / plain_step:.2f}x), errors: {errors}. "
        f"Medians over {len(tracked)} steps, {args.threads} threads.",
        "",
        "| where | ms per tracked step | share of the excess |",
        "|---|---|---|",
    ]
    excess = step - plain_step
    for key, value in parts.items():
        lines.append(f"| {key} | {1e3 * value:.2f} | {100 * value / excess:.0f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
