"""Helpers of the dashboard tests: a throwaway plugin and panel lookup."""

from __future__ import annotations

import types

import numpy as np

from cockpit_core import Quantity, hookimpl
from cockpit_core.panel import Instrument, series


class Wiggle(Quantity):
    """A made-up quantity: sin(step) (a third-party plugin's quantity)."""

    name = "wiggle"

    def compute(self, ctx):
        return {"total": float(np.sin(ctx.step)), "per_param": np.ones(len(ctx.params))}


def draw_wiggle(ax, output, header):
    steps, values = series(output, "wiggle")
    ax.plot(steps, values, color="purple")


WIGGLE_PANEL = Instrument(
    name="wiggle",
    title="Wiggle-o-meter",
    topic="oddities",
    quantities=("wiggle",),
    draw=draw_wiggle,
    description="A panel of a throwaway plugin.",
)


def make_plugin(*instruments, quantities=(Wiggle,), sinks=()):
    """A plugin module registering ``quantities``, ``instruments`` and ``sinks``."""
    module = types.ModuleType("throwaway_plugin")

    @hookimpl
    def register_quantities(register):
        for q in quantities:
            register(q)

    @hookimpl
    def register_instruments(register):
        for inst in instruments:
            register(inst)

    @hookimpl
    def register_sinks(register):
        for args in sinks:
            register(*args[:2], **(args[2] if len(args) > 2 else {}))

    module.register_quantities = register_quantities
    module.register_instruments = register_instruments
    module.register_sinks = register_sinks
    return module


def panel_titles(fig):
    """Titles of the panels drawn in ``fig`` (left titles set by the dashboard)."""
    return [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]


def figure_texts(fig):
    return [t.get_text() for t in fig.texts]
