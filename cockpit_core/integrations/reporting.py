"""Hand a Cockpit's values to a framework's loggers: scalar dicts and a dashboard image.

:class:`ScalarReporter` is a Cockpit sink (``sink(record)``) that turns each ``values``
record into ``{tag: float}`` with the tag names of every other tracker sink
(:class:`cockpit_core.log.scalars.TagMap`: ``cockpit/loss``, ``cockpit/grad_norm/total``,
``cockpit/hess_max_ev/value``, ...) and passes it, with the record's step, to the host's
``emit(step, scalars)``: Lightning's ``logger.log_metrics``, the Hugging Face Trainer's
``log``. :func:`dashboard_image` renders the dashboard as an RGB array for loggers that
take images.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cockpit_core.cockpit import Cockpit
from cockpit_core.errors import CockpitWarning
from cockpit_core.log.scalars import Scalar, TagMap

Emit = Callable[[int, dict[str, float]], None]


class ScalarReporter:
    """A Cockpit sink passing each step's scalars to ``emit(step, {tag: value})``.

    Histograms and non-scalar values are not passed (the Cockpit's log keeps them).
    ``emit`` failing is the Cockpit's concern: the sink is removed with a warning.

    Args:
        emit: Receives the step and the scalars of each ``values`` record.
        prefix: First part of every tag (``""`` for none).
        per_param: Pass per-parameter scalars (``cockpit/grad_norm/<param>``).
        per_param_max: Only while the Cockpit tracks at most this many parameters.

    """

    def __init__(
        self,
        emit: Emit,
        prefix: str = "cockpit",
        per_param: bool = True,
        per_param_max: int = 32,
    ):
        self.emit = emit
        self.tags = TagMap(prefix, per_param, per_param_max, histograms=False)

    def follow(self, cp: Cockpit) -> ScalarReporter:
        """Receive ``cp``'s records from now on (its header is read from ``cp`` itself)."""
        self.tags.header(cp.header())
        cp.sinks.append(self)
        return self

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Take one Cockpit record."""
        kind = record.get("kind")
        if kind == "header":
            self.tags.header(record)
        elif kind == "quantity_added":
            self.tags.quantity_added(record.get("quantity") or {})
        elif kind == "values":
            scalars = {
                e.tag: e.value for e in self.tags.values(record["values"]) if isinstance(e, Scalar)
            }
            if scalars:
                self.emit(int(record["step"]), scalars)


def dashboard_image(cp: Cockpit, dpi: int = 60) -> np.ndarray | None:
    """The dashboard of ``cp`` as ``uint8[height, width, 3]`` (RGB); ``None`` if it fails.

    A failure (no values yet, a plotting error) warns and returns ``None``: a picture is
    never worth stopping the end of training.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from cockpit_core.dashboard import render

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a failing panel is shown in the picture
            figure = render(cp, None, dpi=dpi)
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()
    except Exception as err:  # plotting must not fail the training run
        warnings.warn(
            f"cockpit: the dashboard image could not be drawn: {err} ({type(err).__name__})",
            CockpitWarning,
            stacklevel=2,
        )
        return None
