"""Count the tensor operations a tracked ``economy`` step dispatches, by where cockpit calls them.

On the small models of ``real_models.py`` a tracked step's excess is mostly the fixed cost of
dispatching thousands of small tensor operations (3-10 µs each on this machine), not their
arithmetic. Unlike a timing, the count does not drift with the machine's load, so it shows
deterministically what a change saved. Every ATen operation reaching the dispatcher during
two tracked steps (after warm-up) is attributed to the innermost frames of cockpit's code
(``cockpit_core`` or a plugin) on the Python stack; ``user`` is the model's own work.

Run ``.venv/bin/python benchmarks/op_counts.py --model gpt2 --depth 2``; ``--plain`` counts a
plain step for comparison. Not a test: the counts change whenever the code does.
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from real_models import MODELS, SIZES, _problem  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from cockpit_core import Cockpit  # noqa: E402

ROOT = str(Path(__file__).resolve().parent.parent)
OURS = (f"{ROOT}/cockpit_core/", f"{ROOT}/plugins/")


class _Count(TorchDispatchMode):
    """Counts each dispatched operation under the innermost ``depth`` frames of cockpit's code."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(OURS)]
        inner = list(reversed(frames[-self.depth :]))
        where = " < ".join(f"{Path(f.filename).name}:{f.name}" for f in inner) or "user"
        self.counts[where] += 1
        return func(*args, **(kwargs or {}))


def main(argv: list[str] | None = None) -> None:
    """Train a few tracked steps, then print the operations per tracked step by location."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2", choices=MODELS)
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--preset", default="economy", help="a preset, or quantities: a,b,c")
    ap.add_argument("--depth", type=int, default=1, help="frames of cockpit's code per location")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--plain", action="store_true", help="count a plain step instead")
    args = ap.parse_args(argv)
    model, batches, losses_fn = _problem(args.model, args.size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    quantities = args.preset.split(",") if "," in args.preset else args.preset
    cp = Cockpit(model, quantities)

    def step(s: int) -> None:
        batch = batches[s % len(batches)]
        opt.zero_grad()
        losses = losses_fn(model, batch)
        loss = losses.mean()
        if args.plain:
            loss.backward()
        else:
            info = {
                "loss": loss,
                "individual_losses": losses.detach(),
                "batch_size": len(batch[0]),
                "optimizer": opt,
            }
            with cp(s, info=info):
                loss.backward(retain_graph=cp.retain_graph(s))
        opt.step()

    for s in range(4):
        step(s)
    counter = _Count(args.depth)
    with counter:
        for s in range(4, 6):
            step(s)
    cp.close()
    total = sum(counter.counts.values()) / 2
    print(
        f"{args.model} ({args.size}), {'plain' if args.plain else args.preset}: "
        f"{total:.0f} operations per step, errors: {len(cp.errors)}"
    )
    for where, n in counter.counts.most_common(args.top):
        print(f"{n / 2:8.0f}  {where}")


if __name__ == "__main__":
    main()
