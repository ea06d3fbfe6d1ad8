"""Dashboard panels of cockpit-basic: loss, performance, effective learning rate, norms, time.

Each ``draw(ax, output, header)`` gets ``{step: {quantity_name: value}}`` restricted to the
panel's quantities (see :class:`cockpit_core.instrument.Instrument`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_basic.lr_relation import headroom, learning_rates, lr_relation
from cockpit_core.panel import (
    Chart,
    Instrument,
    Output,
    last,
    metric_series,
    param_names,
    per_param_series,
    series,
    smooth,
)
from cockpit_core.panel.style import (
    MUTED,
    PRIMARY,
    SECONDARY,
    finish,
    line,
    log_if_wide,
    mark_nonfinite,
)


def draw_loss(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Mini-batch loss (grey) and its moving average over the tracked points (blue)."""
    steps, loss = series(output, "loss", None)
    ax.plot(steps, loss, color=MUTED, lw=0.7, alpha=0.8, label="mini-batch loss")
    logy = log_if_wide(ax, loss)
    line(ax, steps, smooth(loss, log=logy), color=PRIMARY, label="moving average")
    finish(ax, ylabel="loss", legend=True)


SPLITS: tuple[tuple[str, str, str], ...] = (
    ("train", "-", "o"),
    ("valid", "--", "s"),
    ("test", ":", "^"),
)
"""Data splits of the Performance panel: metric prefix, line style, marker."""

PERFORMANCE_METRICS: tuple[str, ...] = tuple(
    f"{split}_{what}" for what in ("loss", "accuracy") for split, _, _ in SPLITS
)
"""The metrics of ``cp.log`` the Performance panel draws (Cockpit 1.0.2's names)."""


def has_performance_metrics(output: Output) -> bool:
    """Whether some step's metrics hold a loss or accuracy the Performance panel draws."""
    return any(len(metric_series(output, name)[0]) for name in PERFORMANCE_METRICS)


def _draw_split_metrics(ax: Any, output: Output, what: str, color: str, short: str) -> list[Any]:
    """Lines of ``<split>_<what>`` for each logged split; labels show the latest value."""
    handles = []
    for split, style, marker in SPLITS:
        steps, values = metric_series(output, f"{split}_{what}")
        if not len(steps):
            continue
        (handle,) = ax.plot(
            steps,
            values,
            color=color,
            ls=style,
            marker=marker,
            ms=3.5,
            lw=1.3,
            label=f"{split} {short} {values[-1]:.3g}",
        )
        mark_nonfinite(ax, steps, values)
        handles.append(handle)
    return handles


def _mark_epochs(ax: Any, output: Output) -> None:
    """Epoch numbers (``epoch_count``) on a top axis at the steps they were logged."""
    steps, epochs = metric_series(output, "epoch_count")
    keep = np.isfinite(epochs)
    steps, epochs = steps[keep], epochs[keep]
    if not len(steps):
        return
    stride = max(1, -(-len(steps) // 8))  # at most 8 labels
    top = ax.secondary_xaxis("top")
    top.set_xticks(steps[::stride], labels=[f"{e:g}" for e in epochs[::stride]])
    top.tick_params(labelsize=7, pad=1)
    top.set_xlabel("epoch", fontsize=7, labelpad=1)


def draw_performance(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Train/valid/test loss (blue, left axis) and accuracy (orange, right axis) over steps.

    As Cockpit 1.0.2's performance plot, from the metrics of ``cp.log``: train solid,
    valid dashed, test dotted; the legend shows each latest value, the top axis the epoch
    numbers when ``epoch_count`` was logged.
    """
    losses = _draw_split_metrics(ax, output, "loss", PRIMARY, "loss")
    if losses:
        ax.set_ylabel("loss", fontsize=8, color=PRIMARY)
        loss_values = np.concatenate([h.get_ydata() for h in losses])
        log_if_wide(ax, loss_values)
    acc_ax = ax.twinx() if losses else ax
    accuracies = _draw_split_metrics(acc_ax, output, "accuracy", SECONDARY, "acc")
    if accuracies:
        acc_ax.set_ylabel("accuracy", fontsize=8, color=SECONDARY)
        acc_ax.tick_params(labelsize=7)
    _mark_epochs(ax, output)
    finish(ax)
    handles = losses + accuracies
    ax.legend(
        handles,
        [h.get_label() for h in handles],
        fontsize=6.5,
        loc="center right",
        ncol=2 if len(handles) > 3 else 1,
        framealpha=0.8,
    )


def draw_effective_lr(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Update size over gradient norm, ``||θ_{t+1} - θ_t|| / ||g_t||``, and the optimizer's lr.

    The learning rate (orange, dashed) comes from ``optimizer_hparams`` when tracked; the
    caption says how the two relate for the logged optimizer (:func:`lr_relation`).
    """
    s_u, upd = series(output, "update_size")
    s_g, gnorm = series(output, "grad_norm")
    common, iu, ig = np.intersect1d(s_u, s_g, return_indices=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = upd[iu] / gnorm[ig]
    ax.plot(common, ratio, color=MUTED, lw=0.7, label=r"$\|\Delta\theta\| / \|g\|$")
    rates = learning_rates(output)
    logy = log_if_wide(ax, np.concatenate([ratio, *(lr for _, lr, _ in rates)]))
    line(ax, common, smooth(ratio, log=logy), color=PRIMARY, label="moving average")
    for steps, lr, label in rates:
        ax.step(steps, lr, where="post", color=SECONDARY, ls="--", lw=1.2, label=label)
    finish(ax, ylabel=r"$\|\Delta\theta\| / \|g\|$")
    headroom(ax, 0.45)  # caption and legend above the data
    ax.legend(fontsize=6.5, loc="upper right", bbox_to_anchor=(1.0, 0.82), framealpha=0.7)
    ax.text(
        0.02,
        0.97,
        lr_relation(last(output, "optimizer_hparams")[1]),
        transform=ax.transAxes,
        ha="left",
        va="top",
        fontsize=6.5,
        color="#444455",
    )


def draw_grad_norm(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Total gradient norm over steps with a moving average."""
    steps, norm = series(output, "grad_norm")
    ax.plot(steps, norm, color=MUTED, lw=0.7, alpha=0.8, label=r"$\|g\|$")
    logy = log_if_wide(ax, norm)
    line(ax, steps, smooth(norm, log=logy), color=PRIMARY, label="moving average")
    finish(ax, ylabel="gradient norm", legend=True)


def draw_per_layer(
    ax: Any, output: Output, header: Mapping[str, Any], name: str, ylabel: str
) -> None:
    """One line per parameter of a ``{"total", "per_param"}`` quantity (top 8 labelled)."""
    steps, per = per_param_series(output, name)
    if per.size == 0:
        ax.text(0.5, 0.5, "no per-parameter values", ha="center", transform=ax.transAxes)
        return
    names = param_names(header, per.shape[1])
    cmap = _cmap(per.shape[1])
    for j in range(per.shape[1]):
        label = names[j] if j < 8 else None
        ax.plot(steps, per[:, j], color=cmap[j], lw=1.0, label=label)
        mark_nonfinite(ax, steps, per[:, j])
    log_if_wide(ax, per)
    finish(ax, ylabel=ylabel)
    if per.shape[1] <= 12:
        ax.legend(fontsize=6, loc="best", ncol=2, framealpha=0.6)


def _cmap(n: int) -> list[Any]:
    from matplotlib import colormaps

    cm = colormaps["viridis"]
    return [cm(x) for x in np.linspace(0.0, 0.9, max(n, 1))]


def draw_distance(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Distance from the start (left axis) and update size (right axis)."""
    handles = []
    if any("distance" in v for v in output.values()):
        steps, dist = series(output, "distance")
        handles += ax.plot(
            steps, dist, color=PRIMARY, lw=1.3, label=r"distance $\|\theta_t-\theta_0\|$"
        )
        mark_nonfinite(ax, steps, dist)
        ax.set_ylabel(r"distance $\|\theta_t-\theta_0\|$", fontsize=8, color=PRIMARY)
    if any("update_size" in v for v in output.values()):
        twin = ax.twinx() if handles else ax
        steps, upd = series(output, "update_size")
        handles += twin.plot(steps, upd, color=SECONDARY, lw=1.0)
        mark_nonfinite(twin, steps, upd)
        log_if_wide(twin, upd)
        twin.set_ylabel(r"update size $\|\theta_{t+1}-\theta_t\|$", fontsize=8, color=SECONDARY)
        twin.tick_params(labelsize=7)
    finish(ax)  # the axis labels carry the colours of their curves: no legend over the data


def draw_parameters(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Norm of each parameter tensor over steps (from the ``parameters`` snapshots)."""
    steps, rows = [], []
    for step in sorted(output):
        params = output[step]["parameters"]
        rows.append([float(np.linalg.norm(np.asarray(p, dtype=float))) for p in params])
        steps.append(step)
    per = np.asarray(rows, dtype=float)
    fake = {s: {"p": {"per_param": r}} for s, r in zip(steps, per)}
    draw_per_layer(ax, fake, header, "p", r"$\|\theta_i\|$")


def draw_time(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Seconds per training step between consecutive tracked steps."""
    steps, t = series(output, "time", None)
    if len(steps) < 2:
        ax.text(0.5, 0.5, "needs two tracked steps", ha="center", transform=ax.transAxes)
        return
    per_step = np.diff(t) / np.diff(steps)
    line(ax, steps[1:], per_step * 1e3, color=PRIMARY)
    finish(ax, ylabel="ms per step")


INSTRUMENTS = [
    Instrument(
        name="loss",
        title="Mini-batch loss",
        topic="performance",
        quantities=("loss",),
        draw=draw_loss,
        order=20,
        size=2.0,
        description="Training loss per step and its moving average.",
        chart=Chart({"loss": None}),
    ),
    Instrument(
        name="hyperparameters",
        title="Effective learning rate",
        topic="performance",
        quantities=("update_size", "grad_norm"),
        optional=("optimizer_hparams",),
        draw=draw_effective_lr,
        order=10,
        description="Update size / gradient norm next to the optimizer's learning rate "
        "(with optimizer_hparams): equal for plain SGD; momentum, weight decay and adaptive "
        "scaling set them apart.",
    ),
    Instrument(
        name="performance",
        title="Performance",
        topic="performance",
        quantities=("metrics",),
        draw=draw_performance,
        order=25,
        size=2.0,
        description="Train/valid/test loss and accuracy logged with cp.log(step, "
        "train_loss=..., valid_accuracy=...), with epoch numbers (epoch_count).",
        available=has_performance_metrics,
        chart=Chart({"metrics": None}, title="Performance (metrics of cp.log)", name="metrics"),
    ),
    Instrument(
        name="time",
        title="Time per step",
        topic="performance",
        quantities=("time",),
        draw=draw_time,
        order=30,
        min_steps=2,
        description="Wall-clock milliseconds per training step.",
        chart=Chart({"time": None}, title="Time since the first tracked step (s)"),
    ),
    Instrument(
        name="distance",
        title="Distance & update size",
        topic="step size",
        quantities=(),
        optional=("distance", "update_size"),
        draw=draw_distance,
        order=20,
        description="How far the parameters moved from the start, and each update's length.",
        chart=Chart(
            {"distance": ("total",), "update_size": ("total",)},
            title="Distance from start & update size",
        ),
    ),
    Instrument(
        name="grad_norm",
        title="Gradient norm",
        topic="step size",
        quantities=("grad_norm",),
        draw=draw_grad_norm,
        order=30,
        description="Norm of the mini-batch gradient.",
        chart=Chart({"grad_norm": ("total",)}),
    ),
    Instrument(
        name="parameters",
        title="Parameter norm per layer",
        topic="step size",
        quantities=("parameters",),
        draw=draw_parameters,
        order=40,
        description="Norm of each parameter tensor (from the parameter snapshots).",
    ),
    Instrument(
        name="grad_norm_layers",
        title="Gradient norm per layer",
        topic="gradient",
        quantities=("grad_norm",),
        draw=lambda ax, output, header: draw_per_layer(
            ax, output, header, "grad_norm", r"$\|g_i\|$"
        ),
        order=90,
        description="Gradient norm of each parameter tensor: which layers learn.",
    ),
]
"""The panels this plugin registers."""
