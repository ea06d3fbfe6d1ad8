"""The demo: train a small MLP on scikit-learn's bundled 8x8 digits with cockpit on.

Nothing is downloaded: the data ships inside scikit-learn. The run folder gets the log
(``log.jsonl``), a consolidated ``output.json`` and the dashboard picture ``dashboard.png``;
the folder is printed at the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from cockpit_core.cockpit import Cockpit
from cockpit_core.testing.problems import extend


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 digit images (scaled to [0, 1], flattened) and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - scikit-learn is a demo dependency
        raise SystemExit("The demo needs scikit-learn: pip install 'cockpit-core[demo]'.") from err
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return x, y


def make_model() -> torch.nn.Module:
    """A 64-32-10 ReLU network."""
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _progress(step: int, steps: int, loss: float, started: float) -> None:
    width = 30
    done = int(width * (step + 1) / steps)
    elapsed = time.perf_counter() - started
    bar = "#" * done + "-" * (width - done)
    end = "\n" if step + 1 == steps else ""
    sys.stderr.write(f"\r[{bar}] step {step + 1}/{steps}  loss {loss:.4f}  {elapsed:.1f}s{end}")
    sys.stderr.flush()


def run_demo(
    preset: str = "economy",
    steps: int = 300,
    out: str | Path | None = None,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 0.1,
) -> Path:
    """Train for ``steps`` steps with the ``preset`` quantities and return the run folder.

    Args:
        preset: A preset name or comma-separated quantity names.
        steps: Number of SGD steps.
        out: Run folder (default ``runs/demo-<timestamp>``).
        seed: Seed of the model initialisation and batch order.
        batch_size: Mini-batch size.
        lr: Learning rate of SGD with momentum 0.9.

    """
    torch.manual_seed(seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    run = Path(out) if out is not None else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    run.mkdir(parents=True, exist_ok=True)
    x, y = load_digits_tensors()
    # module hooks compute the first-order statistics; BackPACK (when installed) the
    # curvature diagonals of the business and full presets, which need extended modules
    model = extend(make_model())
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    quantities = (
        preset if "," not in preset else [q.strip() for q in preset.split(",") if q.strip()]
    )
    cp = Cockpit(model, quantities, log=run / "log.jsonl")
    gen = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, len(x), (batch_size,), generator=gen)
        xb, yb = x[idx], y[idx]
        opt.zero_grad()
        outputs = model(xb)
        loss = loss_fn(outputs, yb)
        losses = F.cross_entropy(outputs, yb, reduction="none").detach()
        info = {
            "loss": loss,
            "individual_losses": losses,
            "batch_size": batch_size,
            "optimizer": opt,
        }
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
        _progress(step, steps, loss.item(), started)
    cp.close()
    cp.write(run / "output.json")
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    title = (
        f"cockpit demo: 64-32-10 MLP on the 8x8 digits, preset '{preset}', {steps} steps of "
        f"SGD (lr {lr}, momentum 0.9, batch {batch_size}), training accuracy {accuracy:.3f}"
    )
    picture = _plot(cp, run / "dashboard.png", title)
    print(f"Trained {steps} steps, training accuracy {accuracy:.3f}.")
    files = ", ".join(["log.jsonl", "output.json"] + ([picture.name] if picture else []))
    print(f"Run folder: {run.resolve()}  ({files})")
    return run


def _plot(cp: Cockpit, path: Path, title: str) -> Path | None:
    """Write the dashboard picture; a plotting failure never loses the trained run."""
    try:
        return cp.plot(path, title=title)
    except Exception as err:  # pragma: no cover - reported, the log is still there
        print(
            f"Could not draw the dashboard ({type(err).__name__}: {err}); the log is complete:"
            f" draw it later with `cockpit plot {path.parent / 'log.jsonl'}`.",
            file=sys.stderr,
        )
        return None
