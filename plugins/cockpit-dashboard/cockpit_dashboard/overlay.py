"""Overlay: draw several runs' versions of one panel on the same axes, a colour per run.

:func:`draw_overlay` calls each run's ``draw`` on the same axes, one after the other, and
then re-colours whatever each call added (lines, patches, collections, texts, twin axes)
in that run's colour, so instruments need no change to be compared:

* grey artists (raw per-step values) become faint, fills translucent; the red NaN/inf
  marks of :func:`~cockpit_core.panel.style.mark_nonfinite` stay red;
* a line or text that every run draws identically (a reference line such as ``y = 1``) is
  kept once in its own colour; texts that differ are stacked, one line per run;
* twin axes that the calls create get one common range; only the first shows its ticks;
  a secondary axis (e.g. epochs on top) is kept from the first run;
* the instrument's legends are replaced by one legend naming the runs; line styles keep
  the instrument's meaning (e.g. train solid, validation dashed).

With ``decide`` the first run's drawing is checked first: a colour-mapped mesh, image or
scatter, inset axes or new figure axes cannot share axes with another run, and the caller
draws the panel side by side instead (see :mod:`cockpit_dashboard.compare`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from cockpit_core.panel.planning import Panel, panel_output
from cockpit_dashboard.runs import Run

FAINT_ALPHA = 0.3
"""Opacity of a run's grey (raw, per-step) artists once re-coloured."""
FILL_ALPHA = 0.3
"""Largest opacity of a run's filled areas (histogram bars, shaded spans)."""
NEUTRAL = "#333344"
"""Axis labels that an instrument coloured like its curves (the colours now mean runs)."""


def _artists(ax: Any) -> list[Any]:
    return [*ax.lines, *ax.patches, *ax.collections, *ax.texts, *ax.images]


def _not_overlayable(ax: Any, added: list[Any], new_axes: list[Any], children: list[Any]) -> bool:
    """Whether a drawing holds colour-mapped data, inset axes or axes of its own."""
    from matplotlib.cm import ScalarMappable

    mapped = any(isinstance(a, ScalarMappable) and a.get_array() is not None for a in added)
    insets = any(not _secondary(c) for c in children)
    own_axes = any(not _twin_of(a, ax) for a in new_axes)
    return mapped or insets or own_axes


def _secondary(axes: Any) -> bool:
    """Whether ``axes`` is a secondary axis (``ax.secondary_xaxis``; no public class)."""
    return type(axes).__name__ == "SecondaryAxis"


def _twin_of(other: Any, ax: Any) -> bool:
    return bool(
        other.get_shared_x_axes().joined(other, ax) or other.get_shared_y_axes().joined(other, ax)
    )


def draw_overlay(
    fig: Any, ax: Any, entries: Sequence[tuple[Run, Panel]], decide: bool = False
) -> bool:
    """Call each run's ``draw`` on ``ax`` and re-colour what it adds (see the module doc).

    Returns ``False`` (after removing what it drew) when ``decide`` is set and the first
    run's drawing cannot be overlaid; a run whose ``draw`` fails is left out with a warning
    and named as failed in the legend.
    """
    drawn: list[tuple[Run, list[tuple[Any, list[Any]]]]] = []
    failed: list[Run] = []
    for run, own in entries:
        axes_before, children_before = list(fig.axes), list(ax.child_axes)
        before = {a: set(_artists(a)) for a in fig.axes}
        try:
            own.instrument.draw(ax, panel_output(run.data, own), run.data.header)
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:  # a broken instrument must not break the comparison
            _drop_new(fig, ax, axes_before, children_before, before)
            warnings.warn(
                f"cockpit dashboard: instrument '{own.instrument.name}' failed for run "
                f"'{run.label}': {type(err).__name__}: {err}",
                stacklevel=5,
            )
            failed.append(run)
            continue
        new_axes = [a for a in fig.axes if a not in axes_before]
        children = [c for c in ax.child_axes if c not in children_before]
        roles = [ax, *new_axes, *children]
        added = [(a, [x for x in _artists(a) if x not in before.get(a, ())]) for a in roles]
        flat = [x for _, xs in added for x in xs]
        if decide and not drawn and _not_overlayable(ax, flat, new_axes, children):
            _drop_new(fig, ax, axes_before, children_before, before)
            return False
        drawn.append((run, added))
    if not drawn:
        from cockpit_core.panel.style import message

        message(ax, "could not draw this panel for any run (see the warnings)")
    try:
        _recolor_runs(fig, drawn)
        _share_twins(ax, [[a for a, _ in added] for _, added in drawn])
    except Exception as err:  # an artist of an unexpected kind: keep the drawing as it is
        warnings.warn(
            f"cockpit dashboard: could not re-colour the runs of '{ax.get_title(loc='left')}': "
            f"{type(err).__name__}: {err}",
            stacklevel=5,
        )
    _legend(ax, drawn, failed)
    return True


def _drop_new(
    fig: Any,
    ax: Any,
    axes_before: list[Any],
    children_before: list[Any],
    before: dict[Any, set[Any]],
) -> None:
    """Remove the axes, child axes and artists added since the snapshot."""
    for extra in list(fig.axes):
        if extra not in axes_before:
            fig.delaxes(extra)
    for child in list(ax.child_axes):
        if child not in children_before:
            child.remove()
    for a in list(before):
        for artist in _artists(a):
            if artist not in before[a]:
                artist.remove()
    if ax.get_legend() is not None:
        ax.get_legend().remove()


def _signature(artist: Any) -> tuple[object, ...] | None:
    """What makes two lines or texts the same drawing (``None``: never shared)."""
    from matplotlib.lines import Line2D
    from matplotlib.text import Text

    if isinstance(artist, Line2D):
        x, y = (np.asarray(d, dtype=float) for d in artist.get_data())
        return ("line", x.tobytes(), y.tobytes(), artist.get_linestyle(), artist.get_marker())
    if isinstance(artist, Text):
        return ("text", artist.get_text(), artist.get_position(), artist.get_horizontalalignment())
    return None


def _recolor_runs(fig: Any, drawn: list[tuple[Run, list[tuple[Any, list[Any]]]]]) -> None:
    """Re-colour each run's artists; keep artists that every run draws identically once."""
    from matplotlib.text import Text
    from matplotlib.transforms import offset_copy

    sigs = [[{_signature(a) for a in artists} for _, artists in added] for _, added in drawn]
    for k, (run, added) in enumerate(drawn):
        for role, (_, artists) in enumerate(added):
            for artist in artists:
                sig = _signature(artist)
                shared = (
                    len(drawn) > 1
                    and sig is not None
                    and all(role < len(s) and sig in s[role] for s in sigs)
                )
                if shared and k > 0:
                    artist.remove()
                elif not shared:
                    recolor(artist, run.color)
                    if isinstance(artist, Text) and k > 0:  # stack the runs' texts
                        lines = artist.get_text().count("\n") + 1
                        # points (get_size_in_points); the stub also allows a str
                        size = cast(float, artist.get_fontsize())
                        step = -1.25 * k * lines * size
                        artist.set_transform(
                            offset_copy(artist.get_transform(), fig=fig, y=step, units="points")
                        )


def _grey(color: Any) -> bool:
    from matplotlib.colors import to_rgba

    r, g, b, _ = to_rgba(color)
    return max(r, g, b) - min(r, g, b) < 0.08


def recolor(artist: Any, color: str) -> None:
    """Give one artist a run's colour: grey ones faint, fills translucent, NaN marks kept."""
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.text import Text

    if isinstance(artist, Line2D):
        if artist.get_label() == "NaN/inf":
            return
        faint = _grey(artist.get_color())
        same_edge = artist.get_markeredgecolor() == artist.get_color()
        artist.set_color(color)
        if str(artist.get_markerfacecolor()) != "none":
            artist.set_markerfacecolor(color)
        if same_edge:
            artist.set_markeredgecolor(color)
        if faint:
            artist.set_alpha(min(artist.get_alpha() or 1.0, FAINT_ALPHA))
    elif isinstance(artist, Patch):
        faint = artist.get_fill() and _grey(artist.get_facecolor())
        if artist.get_fill():
            artist.set_facecolor(color)
        edge = cast(tuple[float, float, float, float], artist.get_edgecolor())  # RGBA
        if edge[3] > 0:
            artist.set_edgecolor(color)
        cap = FAINT_ALPHA if faint else FILL_ALPHA if artist.get_fill() else 1.0
        artist.set_alpha(min(artist.get_alpha() or 1.0, cap))
    elif isinstance(artist, Collection):
        faces = np.asarray(artist.get_facecolor())  # an (N, 4) RGBA array already
        if len(faces) and np.any(faces[:, 3] > 0):
            artist.set_facecolor(color)
            artist.set_alpha(min(artist.get_alpha() or 1.0, FILL_ALPHA))
        edges = np.asarray(artist.get_edgecolor())
        if len(edges) and np.any(edges[:, 3] > 0):
            artist.set_edgecolor(color)
    elif isinstance(artist, Text):
        artist.set_color(color)


def _share_twins(ax: Any, roles: list[list[Any]]) -> None:
    """Give the j-th twin axes of every run one range; only the first keeps its ticks."""
    for j in range(1, max((len(r) for r in roles), default=0)):
        group = [r[j] for r in roles if j < len(r)]
        first = group[0]
        if first in ax.child_axes:  # a secondary axis (e.g. epochs on top): the first one
            for other in group[1:]:
                if _secondary(other):
                    other.remove()
            continue
        shares_x = first.get_shared_x_axes().joined(first, ax)
        get, put, scale = (
            ("get_ylim", "set_ylim", "yscale") if shares_x else ("get_xlim", "set_xlim", "xscale")
        )
        lims = np.array([getattr(a, get)() for a in group])
        scales = {a.get_yscale() if shares_x else a.get_xscale() for a in group}
        use = "log" if "log" in scales and lims.min() > 0 else "linear"
        for k, a in enumerate(group):
            a.set(**{scale: use})
            getattr(a, put)(lims.min(), lims.max())
            (a.yaxis if shares_x else a.xaxis).label.set_color(NEUTRAL)
            if k > 0:
                a.set_axis_off()
    ax.yaxis.label.set_color(NEUTRAL)


def _legend(ax: Any, drawn: list[tuple[Run, Any]], failed: list[Run]) -> None:
    """Replace the instruments' legends with one entry per run (failed runs say so)."""
    from matplotlib.lines import Line2D

    for a in [ax] + [a for _, added in drawn for a, _ in added[1:]]:
        if a.get_legend() is not None:
            a.get_legend().remove()
    axes = [ax] + [a for a, _ in drawn[0][1][1:] if a in ax.figure.axes] if drawn else [ax]
    handles = [Line2D([], [], color=run.color, lw=2, label=run.label) for run, _ in drawn]
    handles += [
        Line2D([], [], color=run.color, lw=2, ls=":", label=f"{run.label} (could not draw)")
        for run in failed
    ]
    top = max(reversed(axes), key=lambda a: a.get_zorder())  # drawn last among the highest
    top.legend(handles=handles, fontsize=6.5, loc="best", framealpha=0.8)
