"""Small plugin topics share a column instead of each taking a mostly empty one."""

import numpy as np
import pytest
from cockpit_dashboard import render

from cockpit_core.log import LogData
from cockpit_core.panel import Instrument, series

from ._helpers import figure_texts


def _draw(ax, output, header):
    steps, values = series(output, "wiggle")
    ax.plot(steps, values)


def _panels(*topics):
    """One instrument per entry of ``topics`` (its topic), titled ``P0``, ``P1``, ..."""
    return [
        Instrument(
            name=f"p{i}", title=f"P{i}", topic=t, quantities=("wiggle",), draw=_draw, order=i
        )
        for i, t in enumerate(topics)
    ]


DATA = LogData({}, {s: {"wiggle": {"total": float(np.sin(s))}} for s in range(4)})
PANEL_SIZE = (4.0, 2.5)


def _columns(fig):
    """Panel titles grouped by column (same left edge), each column top to bottom."""
    axes = [a for a in fig.axes if a.get_title(loc="left")]
    lefts = sorted({round(a.get_position().x0, 6) for a in axes})
    return [
        [
            a.get_title(loc="left")
            for a in sorted(axes, key=lambda a: -a.get_position().y0)
            if round(a.get_position().x0, 6) == left
        ]
        for left in lefts
    ]


def _boxes(fig):
    """The topic backgrounds as (x0, y0, x1, y1) in figure fractions."""
    return [p.get_bbox().bounds for p in fig.patches]


def test_one_and_two_panel_plugin_topics_share_a_column():
    # a three-panel standard topic sets the column height to 3 slots; the plugin topics
    # 'curiosities' (2 panels) and 'oddities' (1 panel) fill the second column together
    insts = _panels("step size", "step size", "step size", "oddities", "curiosities", "curiosities")
    fig = render(DATA, instruments=insts, panel_size=PANEL_SIZE)
    assert _columns(fig) == [["P0", "P1", "P2"], ["P4", "P5", "P3"]]
    assert fig.get_size_inches()[0] == pytest.approx(2 * PANEL_SIZE[0])
    texts = figure_texts(fig)
    assert {"STEP SIZE", "CURIOSITIES", "ODDITIES"} <= set(texts)
    # each topic has its own background; the two stacked ones do not overlap
    (x0, y0, w, h), (u0, v0, uw, uh) = _boxes(fig)[1:3]
    assert x0 == pytest.approx(u0) and w == pytest.approx(uw)
    assert v0 + uh < y0 or y0 + h < v0


def test_a_topic_that_does_not_fit_gets_its_own_column():
    # 3 + 1 panels exceed the 3 slots of a column: the one-panel topic starts a new one
    insts = _panels("step size", "step size", "step size", "gizmos", "gizmos", "gizmos", "oddities")
    fig = render(DATA, instruments=insts, panel_size=PANEL_SIZE)
    assert _columns(fig) == [["P0", "P1", "P2"], ["P3", "P4", "P5"], ["P6"]]


def test_standard_topics_keep_their_own_columns():
    insts = _panels("step size", "step size", "step size", "gradient", "curvature")
    fig = render(DATA, instruments=insts, panel_size=PANEL_SIZE)
    assert _columns(fig) == [["P0", "P1", "P2"], ["P3"], ["P4"]]
