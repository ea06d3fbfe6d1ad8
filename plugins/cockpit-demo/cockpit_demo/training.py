"""The demo: train a small MLP on scikit-learn's bundled 8x8 digits with cockpit on.

Nothing is downloaded: the data ships inside scikit-learn. Every fifth image is held out
for validation; an epoch is one pass over the shuffled training split in full mini-batches.
At the start of every epoch (and after the last step) the demo measures loss and accuracy
on both splits and records them with ``cp.log``, so the dashboard shows its *Performance*
panel, together with the ``learning_rate`` (which labels the run in comparisons). The run
folder gets the log (``log.jsonl``), a consolidated ``output.json`` and the dashboard
picture ``dashboard.png``; the folder is printed at the end. :func:`run_compare_lr` trains
once per learning rate from the same initialisation and batch order and draws the runs
into one comparison dashboard, the paper's central workflow; :mod:`cockpit_demo.scenarios`
trains it in deliberately bad ways for the diagnoses. Progress goes to standard error: a tqdm
bar on a terminal, otherwise (a file, a pipe, a CI log) one line at every tenth of the run, so
logs get no carriage returns. The pictures are drawn by the installed renderer of ``.png``
(cockpit-dashboard), which this module never imports.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from cockpit_core.config.quantities import resolve_quantities
from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import ConfigError
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing.problems import prepared


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 digit images (scaled to [0, 1], flattened) and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - scikit-learn is a demo dependency
        raise SystemExit("The demo needs scikit-learn: pip install cockpit-demo.") from err
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return x, y


def split_train_valid(
    x: torch.Tensor, y: torch.Tensor, every: int = 5
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Every ``every``-th sample for validation, the others for training (deterministic)."""
    valid = torch.arange(len(x)) % every == 0
    return (x[~valid], y[~valid]), (x[valid], y[valid])


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``(x, y)`` (no gradients)."""
    with torch.no_grad():
        outputs = model(x)
        loss = F.cross_entropy(outputs, y).item()
        accuracy = (outputs.argmax(1) == y).float().mean().item()
    return loss, accuracy


def _log_performance(
    cp: Cockpit,
    step: int,
    model: torch.nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    valid: tuple[torch.Tensor, torch.Tensor],
    epoch: int | None,
    lr: float,
) -> tuple[float, float]:
    """Log loss, accuracy (both splits) and learning rate at ``step``; return the accuracies."""
    train_loss, train_accuracy = evaluate(model, *train)
    valid_loss, valid_accuracy = evaluate(model, *valid)
    cp.log(
        step,
        epoch_count=epoch,
        learning_rate=lr,
        train_loss=train_loss,
        valid_loss=valid_loss,
        train_accuracy=train_accuracy,
        valid_accuracy=valid_accuracy,
    )
    return train_accuracy, valid_accuracy


def make_model() -> torch.nn.Module:
    """A 64-32-10 ReLU network."""
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def demo_quantities(preset: str) -> str | list[str]:
    """The demo Cockpit's ``quantities`` for ``preset``, checked against the installed plugins.

    Args:
        preset: A preset name or comma-separated quantity names.

    Raises:
        ConfigError: ``preset`` names no installed preset or quantity; the message lists the
            installed quantities and presets.

    """
    spec: str | list[str] = (
        preset if "," not in preset else [q.strip() for q in preset.split(",") if q.strip()]
    )
    if not spec:
        raise ConfigError([("preset", "names no preset or quantity")])
    registry = default_registry()
    try:
        resolve_quantities(spec, registry)
    except ConfigError as err:
        presets = ", ".join(sorted(registry.presets))
        errors = [(where, f"{message} Presets: {presets}.") for where, message in err.errors]
        raise ConfigError(errors) from None
    return spec


def _terminal_bar(steps: int, stream: TextIO) -> Any:
    """A tqdm bar on ``stream`` if it is a terminal and tqdm is installed, else ``None``."""
    try:
        if not stream.isatty():
            return None
        from tqdm import tqdm
    except (AttributeError, ValueError, ImportError):  # no isatty, a closed stream, no tqdm
        return None
    return tqdm(total=steps, file=stream, desc="training", unit="step", dynamic_ncols=True)


@contextlib.contextmanager
def progress(steps: int, stream: TextIO | None = None) -> Iterator[Callable[[int, float], None]]:
    """Report training progress on ``stream`` (standard error); yields ``update(step, loss)``.

    On a terminal a tqdm bar is redrawn in place; elsewhere (a file, a pipe, a CI log), or
    without tqdm, one line ``step N/STEPS  loss L  Ts`` is written at every tenth of the
    run and at its last step, so that a log gets no carriage returns.
    """
    stream = sys.stderr if stream is None else stream
    bar = _terminal_bar(steps, stream)
    marks = {math.ceil(steps * tenth / 10) for tenth in range(1, 11)}
    started = time.perf_counter()

    def update(step: int, loss: float) -> None:
        if bar is not None:
            bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
            bar.update(1)
        elif step + 1 in marks:
            elapsed = time.perf_counter() - started
            stream.write(f"step {step + 1}/{steps}  loss {loss:.4f}  {elapsed:.1f}s\n")
            stream.flush()

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def run_demo(
    preset: str = "economy",
    steps: int = 300,
    out: str | Path | None = None,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 0.1,
    picture: bool = True,
    build_model: Callable[[], torch.nn.Module] = make_model,
    diagnoses: Sequence[str | dict[str, Any]] | None = None,
    lr_at: Callable[[int], float] | None = None,
) -> Path:
    """Train for ``steps`` steps with the ``preset`` quantities and return the run folder.

    Args:
        preset: A preset name or comma-separated quantity names.
        steps: Number of SGD steps.
        out: Run folder (default ``runs/demo-<timestamp>``).
        seed: Seed of the model initialisation and batch order.
        batch_size: Mini-batch size.
        lr: Learning rate of SGD with momentum 0.9.
        picture: Draw the run's dashboard (``dashboard.png``).
        build_model: Builds the network, after seeding (default :func:`make_model`).
        diagnoses: Diagnoses to run while training (``Cockpit(diagnoses=...)``); their
            findings go into the log.
        lr_at: The learning rate of each step's update, ``lr_at(step)`` (default ``lr``
            throughout); the scenarios' one-step spike.

    Raises:
        ValueError: ``steps`` is below 1; checked before the run folder is created.
        ConfigError: ``preset`` names no installed preset or quantity; likewise.

    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    quantities = demo_quantities(preset)
    torch.manual_seed(seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    run = Path(out) if out is not None else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    run.mkdir(parents=True, exist_ok=True)
    train, valid = split_train_valid(*load_digits_tensors())
    x, y = train
    per_epoch = len(x) // batch_size  # full mini-batches per pass over the training split
    # module hooks compute the first-order statistics; BackPACK (when installed) the
    # curvature diagonals of the business and full presets, which need extended modules
    model = prepared(build_model())
    loss_fn = prepared(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    cp = Cockpit(model, quantities, log=run / "log.jsonl", diagnoses=diagnoses)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=gen)
    with progress(steps) as report:
        for step in range(steps):
            epoch, batch = divmod(step, per_epoch)
            if batch == 0:  # a new epoch: measure where it starts, reshuffle the training split
                _log_performance(cp, step, model, train, valid, epoch, lr)
                order = torch.randperm(len(x), generator=gen)
            idx = order[batch * batch_size : (batch + 1) * batch_size]
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
            if lr_at is not None:
                for group in opt.param_groups:
                    group["lr"] = lr_at(step)
            opt.step()
            report(step, loss.item())
    # after the last step (epoch_count only where an epoch starts)
    train_accuracy, valid_accuracy = _log_performance(cp, steps, model, train, valid, None, lr)
    cp.close()
    cp.write(run / "output.json")
    epochs = steps / per_epoch
    title = (
        f"cockpit demo: 64-32-10 MLP on the 8x8 digits, preset '{preset}', {steps} steps "
        f"({epochs:.1f} epochs) of SGD (lr {lr}, momentum 0.9, batch {batch_size}), "
        f"accuracy train {train_accuracy:.3f} / validation {valid_accuracy:.3f}"
    )
    drawn = _plot(cp, run / "dashboard.png", title) if picture else None
    print(
        f"Trained {steps} steps ({epochs:.1f} epochs), accuracy: train {train_accuracy:.3f}, "
        f"validation {valid_accuracy:.3f}."
    )
    files = ", ".join(["log.jsonl", "output.json"] + ([drawn.name] if drawn else []))
    print(f"Run folder: {run.resolve()}  ({files})")
    return run


def run_compare_lr(
    lrs: Sequence[float],
    preset: str = "economy",
    steps: int = 300,
    out: str | Path | None = None,
    seed: int = 0,
    batch_size: int = 64,
) -> Path:
    """Train the demo once per learning rate and draw the runs into one comparison picture.

    Every run starts from the same initialisation and sees the same batches (``seed``), so
    only the learning rate differs, as in the paper's comparison of learning rates
    (Schneider, Dangel & Hennig, "Cockpit", NeurIPS 2021). The folder ``out`` gets
    one run folder per learning rate (``lr-0.1/log.jsonl``, ``output.json``) and the
    comparison dashboard ``compare_lr.png``, whose legends name the learning rates.

    Args:
        lrs: Learning rates of SGD with momentum 0.9, one run each.
        preset: A preset name or comma-separated quantity names.
        steps: SGD steps per run.
        out: Folder of the runs (default ``runs/compare-lr-<timestamp>``).
        seed: Seed of the model initialisation and batch order, the same for every run.
        batch_size: Mini-batch size.

    Raises:
        ValueError: No learning rate, one that is not positive, or ``steps`` below 1;
            checked before anything is trained.
        ConfigError: ``preset`` names no installed preset or quantity; likewise.

    """
    rates = [float(lr) for lr in lrs]
    if not rates or not all(math.isfinite(lr) and lr > 0 for lr in rates):
        raise ValueError(f"give one or more positive learning rates, got {list(lrs)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    demo_quantities(preset)
    folder = (
        Path(out) if out is not None else Path("runs") / time.strftime("compare-lr-%Y%m%d-%H%M%S")
    )
    logs = []
    for lr in rates:
        print(f"Learning rate {lr:g}:")
        run = run_demo(preset, steps, folder / f"lr-{lr:g}", seed, batch_size, lr, picture=False)
        logs.append(run / "log.jsonl")
    title = (
        f"cockpit demo --compare-lr: 64-32-10 MLP on the 8x8 digits, preset '{preset}', "
        f"{steps} steps of SGD (momentum 0.9, batch {batch_size}) per learning rate"
    )
    path = folder / "compare_lr.png"
    default_registry().renderer(path).render(logs, path, title=title)
    print(f"Comparison of {len(rates)} learning rates written to {path.resolve()}")
    return folder


def _plot(cp: Cockpit, path: Path, title: str) -> Path | None:
    """Write the dashboard picture; a plotting failure never loses the trained run."""
    try:
        written: Path = cp.plot(path, title=title)  # the picture renderer's path
        return written
    except Exception as err:  # pragma: no cover - reported, the log is still there
        print(
            f"Could not draw the dashboard ({type(err).__name__}: {err}); the log is complete:"
            f" draw it later with `cockpit plot {path.parent / 'log.jsonl'}`.",
            file=sys.stderr,
        )
        return None
