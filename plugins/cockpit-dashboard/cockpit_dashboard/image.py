"""The dashboard as an RGB array, for loggers that take images (TensorBoard, Lightning's)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from cockpit_core.errors import CockpitWarning
from cockpit_dashboard.layout import render


def figure_rgb(figure: Any) -> np.ndarray:
    """Draw a matplotlib ``figure`` headless: ``uint8[height, width, 3]`` (RGB)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def dashboard_image(source: Any, dpi: int = 60) -> np.ndarray | None:
    """The dashboard of ``source`` as ``uint8[height, width, 3]`` (RGB); ``None`` if it fails.

    A failure (no values yet, a plotting error) warns and returns ``None``: a picture is
    never worth stopping the end of training.

    Args:
        source: What :func:`~cockpit_dashboard.layout.render` draws: a
            :class:`~cockpit_core.Cockpit`, a log path, a :class:`~cockpit_core.log.LogData`.
        dpi: Resolution of the image (pixels per inch of the dashboard's figure).

    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a failing panel is shown in the picture
            figure = render(source, None, dpi=dpi)
        return figure_rgb(figure)
    except Exception as err:  # plotting must not fail the training run
        warnings.warn(
            f"cockpit: the dashboard image could not be drawn: {err} ({type(err).__name__})",
            CockpitWarning,
            stacklevel=2,
        )
        return None
