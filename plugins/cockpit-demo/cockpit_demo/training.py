"""The demo: train a small network on bundled data with cockpit on.

Two networks (:data:`MODELS`, ``cockpit demo --model``): ``mlp``, a 64-32-10 MLP on
scikit-learn's bundled 8x8 digits trained with SGD, and ``gpt``, a small nanoGPT trained
with AdamW to predict the next token of a seeded Markov chain (:mod:`cockpit_demo.language`).
Nothing is downloaded: the digits ship inside scikit-learn, the tokens are generated. Every
fifth sample (image, or window of tokens) is held out for validation; an epoch is one pass
over the shuffled training split in full mini-batches. At the start of every epoch (and
after the last step) the demo measures loss and accuracy (of every token, for the GPT) on
both splits and records them with ``cp.log``, so the dashboard shows its *Performance*
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from cockpit_core.config.quantities import resolve_quantities
from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import ConfigError
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing.problems import prepared
from cockpit_demo.language import BLOCK_SIZE, VOCAB, load_token_windows, make_gpt


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


def logits_of(outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The logits of a model's outputs: the tensor itself, or the first of a tuple (nanoGPT)."""
    return outputs if isinstance(outputs, torch.Tensor) else outputs[0]


def per_sample_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each sample ``[B]``: of its class, or the mean over its tokens.

    ``logits`` are ``[B, C]`` for targets ``[B]`` or ``[B, T, C]`` for targets ``[B, T]``;
    the mean of the result is the mean loss of the batch either way.
    """
    losses = F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none")
    return losses.view(len(y), -1).mean(1)


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``(x, y)`` (no gradients).

    For a language model, over every target token of ``y``: the share of positions whose
    most likely next token is the right one.
    """
    with torch.no_grad():
        logits = logits_of(model(x))
        loss = F.cross_entropy(logits.flatten(0, -2), y.flatten()).item()
        accuracy = (logits.argmax(-1) == y).float().mean().item()
    return loss, accuracy


def _log_performance(
    cp: Cockpit,
    step: int,
    model: torch.nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    valid: tuple[torch.Tensor, torch.Tensor],
    epoch: int | None,
    lr: float,
) -> tuple[float, float, float, float]:
    """Log loss, accuracy (both splits) and learning rate at ``step``.

    Returns:
        Train loss, validation loss, train accuracy, validation accuracy.

    """
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
    return train_loss, valid_loss, train_accuracy, valid_accuracy


def make_model() -> torch.nn.Module:
    """A 64-32-10 ReLU network."""
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def sgd(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """SGD with momentum 0.9: the MLP's optimizer."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def adamw(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """AdamW as nanoGPT sets it: betas (0.9, 0.95), weight decay 0.1 on matrices only.

    Matrices (the linear layers, the tied embedding, the positions) decay; biases and
    LayerNorm gains do not.
    """
    params = list(params)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def load_gpt_windows() -> tuple[torch.Tensor, torch.Tensor]:
    """The GPT's samples: windows of the Markov chain's tokens and their next tokens."""
    windows = load_token_windows()
    return windows.x, windows.y


def gpt_floor() -> float:
    """The chain's own mean loss on the validation windows: what no model can beat."""
    windows = load_token_windows()
    return split_train_valid(windows.x, windows.nll)[1][1].mean().item()


@dataclass(frozen=True)
class DemoModel:
    """A network of the demo, its bundled data and how it is trained.

    Attributes:
        title: The network and its data, for titles.
        load_data: Inputs and targets, one sample per row (nothing is downloaded).
        build: Builds the network, after seeding.
        optimizer: ``optimizer(params, lr)``.
        training: How it is trained, for titles: a template of ``{lr}`` and ``{batch}``.
        lr: Default learning rate.
        batch_size: Default mini-batch size (samples).
        loss_inside: ``model(x, y)`` returns ``(logits, mean loss)``, as nanoGPT's does;
            otherwise ``model(x)`` returns the logits and a cross-entropy module the loss.
        backpack: Ready the network for BackPACK (:func:`prepared`), which computes the
            curvature diagonals of the business and full presets on the modules it supports
            (the MLP's; none of nanoGPT's embeddings, LayerNorms and GELUs).
        floor: The lowest validation loss any model can reach, when it is known.

    """

    title: str
    load_data: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    build: Callable[[], torch.nn.Module]
    optimizer: Callable[[Iterable[torch.nn.Parameter], float], torch.optim.Optimizer]
    training: str
    lr: float
    batch_size: int
    loss_inside: bool = False
    backpack: bool = True
    floor: Callable[[], float] | None = None


MODELS: dict[str, DemoModel] = {
    "mlp": DemoModel(
        "64-32-10 MLP on the 8x8 digits",
        load_digits_tensors,
        make_model,
        sgd,
        "SGD (lr {lr}, momentum 0.9, batch {batch})",
        lr=0.1,
        batch_size=64,
    ),
    "gpt": DemoModel(
        f"nanoGPT (2 layers, width 64, 4 heads) on an order-2 Markov chain over {VOCAB} "
        f"tokens (context {BLOCK_SIZE})",
        load_gpt_windows,
        make_gpt,
        adamw,
        "AdamW (lr {lr}, betas 0.9 and 0.95, weight decay 0.1, batch {batch})",
        lr=6e-3,
        batch_size=16,
        loss_inside=True,
        backpack=False,
        floor=gpt_floor,
    ),
}
"""The networks of ``cockpit demo --model``; ``mlp`` is the default."""


def demo_model(name: str) -> DemoModel:
    """The entry of :data:`MODELS` called ``name``.

    Raises:
        ValueError: No such model; the message lists them.

    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name]


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
    batch_size: int | None = None,
    lr: float | None = None,
    picture: bool = True,
    build_model: Callable[[], torch.nn.Module] | None = None,
    diagnoses: Sequence[str | dict[str, Any]] | None = None,
    lr_at: Callable[[int], float] | None = None,
    model: str = "mlp",
) -> Path:
    """Train for ``steps`` steps with the ``preset`` quantities and return the run folder.

    Args:
        preset: A preset name or comma-separated quantity names.
        steps: Number of optimizer steps.
        out: Run folder (default ``runs/demo-<timestamp>``).
        seed: Seed of the model initialisation and batch order.
        batch_size: Mini-batch size (default the model's: 64 images, 16 windows).
        lr: Learning rate (default the model's: 0.1 for SGD with momentum 0.9, 0.006 for
            AdamW).
        picture: Draw the run's dashboard (``dashboard.png``).
        build_model: Builds the network, after seeding (default the model's,
            :func:`make_model` for the MLP).
        diagnoses: Diagnoses to run while training (``Cockpit(diagnoses=...)``); their
            findings go into the log.
        lr_at: The learning rate of each step's update, ``lr_at(step)`` (default ``lr``
            throughout); the scenarios' one-step spike.
        model: Which network trains on which data: a key of :data:`MODELS`.

    Raises:
        ValueError: ``steps`` is below 1 or ``model`` is unknown; checked before the run
            folder is created.
        ConfigError: ``preset`` names no installed preset or quantity; likewise.

    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    spec = demo_model(model)
    quantities = demo_quantities(preset)
    batch_size = spec.batch_size if batch_size is None else batch_size
    lr = spec.lr if lr is None else lr
    torch.manual_seed(seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    run = Path(out) if out is not None else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    run.mkdir(parents=True, exist_ok=True)
    train, valid = split_train_valid(*spec.load_data())
    x, y = train
    per_epoch = len(x) // batch_size  # full mini-batches per pass over the training split
    # module hooks compute the first-order statistics; BackPACK (when installed) the
    # curvature diagonals of the business and full presets, which need extended modules
    net = (build_model or spec.build)()
    net = prepared(net) if spec.backpack else net
    loss_fn = prepared(torch.nn.CrossEntropyLoss())
    opt = spec.optimizer(net.parameters(), lr)
    cp = Cockpit(net, quantities, log=run / "log.jsonl", diagnoses=diagnoses)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=gen)
    with progress(steps) as report:
        for step in range(steps):
            epoch, batch = divmod(step, per_epoch)
            if batch == 0:  # a new epoch: measure where it starts, reshuffle the training split
                _log_performance(cp, step, net, train, valid, epoch, lr)
                order = torch.randperm(len(x), generator=gen)
            idx = order[batch * batch_size : (batch + 1) * batch_size]
            xb, yb = x[idx], y[idx]
            opt.zero_grad()
            if spec.loss_inside:  # nanoGPT: logits, loss = model(idx, targets)
                outputs, loss = net(xb, yb)
            else:
                outputs = net(xb)
                loss = loss_fn(outputs, yb)
            losses = per_sample_losses(outputs, yb).detach()  # a window's mean over its tokens
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
    performance = _log_performance(cp, steps, net, train, valid, None, lr)
    cp.close()
    cp.write(run / "output.json")
    epochs = steps / per_epoch
    train_loss, valid_loss, train_accuracy, valid_accuracy = performance
    title = (
        f"cockpit demo: {spec.title}, preset '{preset}', {steps} steps ({epochs:.1f} epochs) "
        f"of {spec.training.format(lr=lr, batch=batch_size)}, "
        f"accuracy train {train_accuracy:.3f} / validation {valid_accuracy:.3f}"
    )
    summary = f"accuracy: train {train_accuracy:.3f}, validation {valid_accuracy:.3f}"
    if spec.floor is not None:  # where the lowest loss is known, the loss says more
        floor = spec.floor()
        title += f", validation loss {valid_loss:.3f} (the chain's own {floor:.3f})"
        summary = (
            f"loss: train {train_loss:.3f}, validation {valid_loss:.3f} (the chain's own "
            f"{floor:.3f}), {summary}"
        )
    drawn = _plot(cp, run / "dashboard.png", title) if picture else None
    print(f"Trained {steps} steps ({epochs:.1f} epochs), {summary}.")
    files = ", ".join(["log.jsonl", "output.json"] + ([drawn.name] if drawn else []))
    print(f"Run folder: {run.resolve()}  ({files})")
    return run


def run_compare_lr(
    lrs: Sequence[float],
    preset: str = "economy",
    steps: int = 300,
    out: str | Path | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    model: str = "mlp",
) -> Path:
    """Train the demo once per learning rate and draw the runs into one comparison picture.

    Every run starts from the same initialisation and sees the same batches (``seed``), so
    only the learning rate differs, as in the paper's comparison of learning rates
    (Schneider, Dangel & Hennig, "Cockpit", NeurIPS 2021). The folder ``out`` gets
    one run folder per learning rate (``lr-0.1/log.jsonl``, ``output.json``) and the
    comparison dashboard ``compare_lr.png``, whose legends name the learning rates.

    Args:
        lrs: Learning rates of the model's optimizer, one run each.
        preset: A preset name or comma-separated quantity names.
        steps: Optimizer steps per run.
        out: Folder of the runs (default ``runs/compare-lr-<timestamp>``).
        seed: Seed of the model initialisation and batch order, the same for every run.
        batch_size: Mini-batch size (default the model's).
        model: Which network trains on which data: a key of :data:`MODELS`.

    Raises:
        ValueError: No learning rate, one that is not positive, ``steps`` below 1 or an
            unknown ``model``; checked before anything is trained.
        ConfigError: ``preset`` names no installed preset or quantity; likewise.

    """
    rates = [float(lr) for lr in lrs]
    if not rates or not all(math.isfinite(lr) and lr > 0 for lr in rates):
        raise ValueError(f"give one or more positive learning rates, got {list(lrs)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    spec = demo_model(model)
    demo_quantities(preset)
    batch_size = spec.batch_size if batch_size is None else batch_size
    folder = (
        Path(out) if out is not None else Path("runs") / time.strftime("compare-lr-%Y%m%d-%H%M%S")
    )
    logs = []
    for lr in rates:
        print(f"Learning rate {lr:g}:")
        run = run_demo(
            preset, steps, folder / f"lr-{lr:g}", seed, batch_size, lr, False, model=model
        )
        logs.append(run / "log.jsonl")
    training = spec.training.format(lr="as labelled", batch=batch_size)
    title = (
        f"cockpit demo --compare-lr: {spec.title}, preset '{preset}', {steps} steps of "
        f"{training} per learning rate"
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
