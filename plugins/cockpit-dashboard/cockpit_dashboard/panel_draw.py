"""Drawing one panel: a failing instrument is shown in its panel and warned about.

:func:`draw_safely` is how the dashboard calls an instrument's ``draw``, for one run
(:mod:`cockpit_dashboard.layout`) and for each run of a comparison drawn side by side
(:mod:`cockpit_dashboard.compare`): a broken instrument never breaks the dashboard.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from cockpit_core.log import LogData
from cockpit_core.panel.planning import Panel, panel_output
from cockpit_core.panel.style import message


def draw_safely(
    fig: Any, ax: Any, panel: Panel, data: LogData, title: Callable[[Any], None]
) -> None:
    """Draw ``panel`` of ``data`` on ``ax``; a failure is shown in the panel and warned about.

    ``title(ax)`` sets the title again after a failure cleared the axes.
    """
    before = set(fig.axes)
    try:
        panel.instrument.draw(ax, panel_output(data, panel), data.header)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as err:  # a broken instrument (even SystemExit) must not break it
        for extra in list(fig.axes):
            if extra not in before:
                fig.delaxes(extra)
        for child in list(ax.child_axes):
            child.remove()
        ax.clear()
        title(ax)
        message(ax, f"could not draw this panel:\n{type(err).__name__}: {err}"[:200])
        warnings.warn(
            f"cockpit dashboard: instrument '{panel.instrument.name}' failed: "
            f"{type(err).__name__}: {err}",
            stacklevel=5,
        )
