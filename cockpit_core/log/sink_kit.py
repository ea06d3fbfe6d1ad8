"""What the sinks that feed experiment trackers share: their tag options and install hint.

A tracker sink (TensorBoard, Weights & Biases, MLflow, or a third party's) names its series
with :class:`~cockpit_core.log.scalars.TagMap`, so its options model offers TagMap's
options with the same names, defaults and limits. :class:`SinkFields` makes those fields,
worded in the tracker's terms ("Write one tag ...", "Log one metric ..."), so each
model still declares its fields in its own order::

    FIELDS = SinkFields(verb="Log", noun="metric")

    class MyTrackerConfig(BaseModel):
        model_config = ConfigDict(extra="forbid")

        prefix: str = FIELDS.prefix()
        per_param: bool = FIELDS.per_param()
        per_param_max: int = FIELDS.per_param_max()

A tracker's package is imported only when the sink is built, so the plugin can be
installed (and listed) without it; :func:`install_hint` words the error, and
:func:`missing_package` raises it in place of the bare ``ImportError``::

    INSTALL_HINT = install_hint("MyTracker", "mytracker", "cockpit-mytracker")

    def _mytracker():
        with missing_package(INSTALL_HINT):
            import mytracker
        return mytracker

The import statement stays in the plugin, where it names the package the plugin declares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import Field

DEFAULT_PREFIX = "cockpit"
"""First part of every tag unless a sink is told otherwise (``cockpit/loss``)."""

DEFAULT_PER_PARAM_MAX = 32
"""Most parameters a run may track for per-parameter tags to be written."""

MIN_DPI = 10
MAX_DPI = 300
"""Range of the resolution of a rendered dashboard."""


@dataclass(frozen=True)
class SinkFields:
    """Pydantic fields of a tracker sink's options, described in the tracker's words.

    Each method returns a ``Field`` (default, limits, description) for one option of that
    name; the option is passed on as the :class:`~cockpit_core.log.scalars.TagMap`
    argument or dashboard setting of the same name.

    Args:
        verb: What the sink does with a value, capitalized: ``"Write"`` or ``"Log"``.
        noun: What a tracker calls one series, singular: ``"tag"``, ``"key"``, ``"metric"``.

    """

    verb: str
    noun: str

    def prefix(self) -> Any:
        """``prefix``: first part of every tag, ``"cockpit"`` by default."""
        return Field(
            DEFAULT_PREFIX,
            description=f"First part of every {self.noun} ('' for none), e.g. 'cockpit/loss'.",
        )

    def per_param(self) -> Any:
        """``per_param``: one series per parameter for per-parameter values, on by default."""
        return Field(
            True,
            description=f"{self.verb} one {self.noun} per parameter for per-parameter values.",
        )

    def per_param_max(self) -> Any:
        """``per_param_max``: per-parameter series only up to this many parameters (32)."""
        return Field(
            DEFAULT_PER_PARAM_MAX,
            ge=0,
            description=f"{self.verb} per-parameter {self.noun}s only for runs with at most "
            "this many parameters.",
        )

    def histograms(self) -> Any:
        """``histograms``: the 1-D histograms (``grad_hist_1d``), on by default."""
        return Field(True, description=f"{self.verb} 1-D histograms (grad_hist_1d).")

    def image_every(self) -> Any:
        """``image_every``: the dashboard as an image every N steps; 0 (never) by default."""
        return Field(
            0,
            ge=0,
            description=f"{self.verb} the dashboard as an image every N steps and at the end; "
            "0: never.",
        )

    def image_dpi(
        self, default: int = 60, description: str = "Resolution of the dashboard image."
    ) -> Any:
        """``image_dpi``: resolution of the dashboard image, ``MIN_DPI`` to ``MAX_DPI``.

        A sink that draws its picture at another time may give its own ``default`` and
        ``description`` (MLflow's ``dashboard_dpi``: 100, the PNG of ``close()``).
        """
        return Field(default, ge=MIN_DPI, le=MAX_DPI, description=description)


def install_hint(sink: str, package: str, distribution: str, alternative: str = "") -> str:
    """The message of a sink whose tracker package is not installed.

    Args:
        sink: The tracker as users know it (``"W&B"``).
        package: The package to install (``"wandb"``).
        distribution: The plugin's distribution, which depends on it (``"cockpit-wandb"``).
        alternative: A package that serves as well (``"mlflow"`` for ``"mlflow-skinny"``).

    Returns:
        ``"The cockpit W&B sink needs the 'wandb' package, which is not installed. Install
        it with: pip install wandb  (or: pip install cockpit-wandb)."``

    """
    either = f" (or '{alternative}')" if alternative else ""
    return (
        f"The cockpit {sink} sink needs the '{package}'{either} package, which is not "
        f"installed. Install it with: pip install {package}  (or: pip install {distribution})."
    )


@contextmanager
def missing_package(hint: str) -> Iterator[None]:
    """Turn an ``ImportError`` inside the block into ``ImportError(hint)``, chained to it.

    Args:
        hint: The message, e.g. :func:`install_hint`'s.

    Raises:
        ImportError: The block failed to import something.

    """
    try:
        yield
    except ImportError as err:
        raise ImportError(hint) from err
