"""Cockpit 1.0.2's ``CockpitPlotter``, drawing the native dashboard (:mod:`cockpit_dashboard`).

The figure is rendered headless (no pyplot) and saved as Cockpit 1.0.2 names it,
``{savedir}/{savename}__primary[__{savename_append}].png``. Only ``show_plot=True``
touches pyplot, to display the picture in a window.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cockpit_dashboard import plan, render

from cockpit_compat.cockpit import LOG_NAMES
from cockpit_compat.cockpit import Cockpit as CompatCockpit
from cockpit_compat.quantities import LEGACY_CLASSES
from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.errors import CockpitWarning
from cockpit_core.log import LogData, loads, read_run

_SUFFIX = re.compile(r"^(?P<cls>.+?)(?P<suffix>_\d+)?$")


class CockpitPlotter:
    """Draw the dashboard of a Cockpit or of a log written with ``Cockpit.write``.

    Args:
        secondary_screen: Cockpit 1.0.2 drew mean GSNR, CABS, early stopping and the
            per-parameter 2-D histograms on a second figure. The native dashboard has one
            figure that holds those panels whenever they were tracked, so ``True`` only
            warns that no second figure is made.

    """

    def __init__(self, secondary_screen: bool = False):
        if secondary_screen:
            warnings.warn(
                "cockpit_compat.CockpitPlotter(secondary_screen=True): the native "
                "dashboard draws the secondary-screen panels (mean GSNR, CABS, early "
                "stopping, per-parameter 2-D histograms) on its one figure; no "
                "'__secondary' figure is made.",
                CockpitWarning,
                stacklevel=2,
            )
        self.fig: Any = None
        self._window: Any = None

    def plot(
        self,
        source: Any,
        show_plot: bool = True,
        block: bool = False,
        save_plot: bool = False,
        savedir: str | os.PathLike[str] | None = None,
        savename: str = "cockpit",
        savename_append: str | None = None,
        savefig_kwargs: Mapping[str, Any] | None = None,
        show_log_iter: bool = False,
        discard: int | None = None,
        plot_title: str | None = None,
        debug: bool = False,
    ) -> Any:
        """Render the dashboard; show it, save it, or both.

        Args:
            source: A :class:`cockpit_compat.Cockpit` (or native Cockpit), or the
                ``logpath`` given to ``Cockpit.write`` (the file is ``logpath + ".json"``;
                a native log path works too).
            show_plot: Display the figure in a pyplot window (``False``: never touch
                pyplot, e.g. on a headless machine).
            block: With ``show_plot``, wait until the window is closed.
            save_plot: Save the figure to
                ``{savedir}/{savename}__primary[__{savename_append}].{format}``.
            savedir: Folder of the saved figure; defaults to ``source`` if it is a path.
            savename: File name stem.
            savename_append: Appended to the file name after ``__``.
            savefig_kwargs: Passed to ``Figure.savefig``; ``format`` picks the suffix
                (default ``png``), ``dpi`` also sets the rendering resolution.
            show_log_iter: Not supported by the native dashboard (raises if ``True``).
            discard: Leave out steps after this one.
            plot_title: Figure title (default: a summary of the run).
            debug: Print which panels are drawn and which are skipped.

        Returns:
            The matplotlib ``Figure`` (also kept as ``self.fig``).

        Raises:
            ValueError: ``show_log_iter=True``; ``save_plot`` without ``savedir`` for a
                Cockpit source; ``source`` of an unknown type.

        """
        if show_log_iter:
            raise ValueError(
                "CockpitPlotter.plot(show_log_iter=True) is not supported: the native "
                "dashboard's panels choose their own axis scales."
            )
        data, registry = _load(source)
        if discard is not None:
            data = dataclasses.replace(
                data, output={s: v for s, v in data.output.items() if s <= discard}
            )
        kwargs = dict(savefig_kwargs or {})
        dpi = int(kwargs.get("dpi", 100))
        if debug:
            layout = plan(data, registry=registry)
            shown = ", ".join(p.title for p in layout.panels) or "none"
            skipped = ", ".join(inst.title for inst, _ in layout.skipped) or "none"
            print(f"[cockpit|plot] panels: {shown}; not tracked: {skipped}")
        fig = render(data, None, registry=registry, title=plot_title, dpi=dpi)
        self.fig = fig
        if show_plot:
            self._show(fig, block, dpi)
        if save_plot:
            if savedir is None:
                if not isinstance(source, (str, os.PathLike)):
                    raise ValueError("Please specify savedir when plotting a Cockpit.")
                savedir = source
            fmt = kwargs.pop("format", "png")
            append = "" if savename_append is None else f"__{savename_append}"
            path = Path(savedir) / f"{savename}__primary{append}.{fmt}"
            path.parent.mkdir(parents=True, exist_ok=True)
            kwargs.setdefault("facecolor", fig.get_facecolor())
            fig.savefig(path, format=fmt, **kwargs)
        return fig

    def _show(self, fig: Any, block: bool, dpi: int) -> None:
        """Display ``fig`` as a picture in a pyplot window (reused between calls)."""
        import matplotlib.pyplot as plt

        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi, facecolor=fig.get_facecolor())
        buffer.seek(0)
        if self._window is None or not plt.fignum_exists(self._window.number):
            width, height = fig.get_size_inches()
            self._window = plt.figure("Cockpit", figsize=(width, height))
        self._window.clf()
        ax = self._window.add_axes((0, 0, 1, 1))
        ax.imshow(plt.imread(buffer))
        ax.set_axis_off()
        plt.show(block=block)
        if not block:
            plt.pause(0.001)


def _load(source: Any) -> tuple[LogData, Any]:
    """The data to draw and the registry to draw it with."""
    from cockpit_core.panel.planning import load

    if isinstance(source, CompatCockpit):
        source = source.native
    if isinstance(source, (str, os.PathLike)):
        legacy = Path(f"{os.fspath(source)}.json")
        if legacy.is_file():
            return read_legacy_log(legacy), None
        if not Path(source).is_file():
            raise FileNotFoundError(
                f"No log at {legacy} (written by Cockpit.write({os.fspath(source)!r})) or at "
                f"{os.fspath(source)}."
            )
        return load(source), None
    try:
        data = load(source)
    except TypeError:
        raise ValueError(
            f"Source must be a Cockpit or the path given to Cockpit.write. Got {source!r}."
        ) from None
    return data, getattr(source, "registry", None)


def read_legacy_log(path: str | os.PathLike[str]) -> LogData:
    """Read a log in Cockpit 1.0.2's layout into the native layout (for the dashboard).

    The file is decoded safely (no json-tricks object hooks): numeric numpy arrays are
    the only objects it may hold. Values of the 19 quantities are translated back
    (``from_legacy``), the ``log`` metrics gathered under ``"metrics"``; other keys are
    kept as they are. A native consolidated log (``cp.write`` of :class:`cockpit_core.Cockpit`)
    is read as such.

    Raises:
        cockpit_core.log.LogFormatError: The file is not valid JSON or holds unsafe entries.
        ValueError: The file is neither layout.

    """
    path = Path(path)
    data = loads(path.read_bytes())
    if isinstance(data, dict) and isinstance(data.get("output"), dict) and "0" not in data:
        return read_run(path)
    if not isinstance(data, dict) or not all(
        re.fullmatch(r"-?\d{1,20}", str(k)) and isinstance(v, dict) for k, v in data.items()
    ):
        raise ValueError(
            f"{path} is not a Cockpit log: expected {{step: {{quantity: value}}}} as written "
            "by Cockpit.write."
        )
    output: dict[int, dict[str, Any]] = {}
    declared: dict[str, str] = {}
    for step_text, row in data.items():
        values: dict[str, Any] = {}
        metrics = {k: v for k, v in row.items() if k in LOG_NAMES and v is not None}
        for key, value in row.items():
            if key in LOG_NAMES:
                continue
            match = _SUFFIX.match(key)
            cls = LEGACY_CLASSES.get(match["cls"]) if match else None
            if match is None or cls is None:
                values[key] = value
                continue
            native_key = cls.native_name + (match["suffix"] or "")
            try:
                values[native_key] = cls.from_legacy(value)
            except (TypeError, ValueError, KeyError, IndexError) as err:
                warnings.warn(
                    f"{path}: step {step_text}, {key}: unreadable value ({err}); left out of "
                    "the dashboard.",
                    CockpitWarning,
                    stacklevel=2,
                )
                continue
            declared[native_key] = cls.native_name
        if metrics:
            values[METRICS_KEY] = metrics
        output[int(step_text)] = values
    header = {"quantities": [{"name": name, "key": key} for key, name in declared.items()]}
    return LogData(header=header, output=dict(sorted(output.items())))
