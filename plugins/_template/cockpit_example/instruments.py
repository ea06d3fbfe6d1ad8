"""Dashboard panel of the plugin: the largest per-sample gradient norm over steps.

The module imports no plotting library (matplotlib is imported when the dashboard draws),
so the plugin can register it at discovery time for free.
"""

from __future__ import annotations

from typing import Any

from cockpit_core.panel import Instrument, ema, series
from cockpit_core.panel.style import MUTED, PRIMARY, finish, line


def draw_max_sample_grad_norm(ax: Any, output: Any, header: Any) -> None:
    """Raw values (grey) and their moving average (blue); NaN/inf are marked in red."""
    steps, values = series(output, "max_sample_grad_norm")
    ax.plot(steps, values, color=MUTED, lw=0.7, alpha=0.8, label="per step")
    line(ax, steps, ema(values), color=PRIMARY, label="moving average")
    finish(ax, ylabel=r"$\max_n \|g_n\|$", legend=True)


INSTRUMENTS: tuple[Instrument, ...] = (
    Instrument(
        name="max_sample_grad_norm",
        title="Largest per-sample gradient",
        topic="gradient",  # or a lower-case topic of your own: it gets its own column group
        quantities=("max_sample_grad_norm",),  # all must be tracked for the panel to show
        draw=draw_max_sample_grad_norm,
        description="Norm of the largest per-sample gradient of each mini-batch.",
    ),
)
"""The panels this plugin registers (``register_instruments`` in ``plugin.py``)."""
