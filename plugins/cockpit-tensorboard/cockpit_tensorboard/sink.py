"""The TensorBoard sink: cockpit records -> TensorBoard scalars, histograms and text.

How values map to TensorBoard (tags are the quantity keys):

* a number -> scalar ``key``;
* ``{"total": x, "per_param": [...]}`` -> scalar ``key/total`` and, with ``per_param``,
  one scalar per parameter ``key/<param name>``; other numeric fields -> ``key/<field>``;
* ``{"hist": counts, "edges": edges, ...}`` (1-D) -> a histogram built from the bin
  counts (no re-binning), and with ``per_param`` counts ``[P, bins]`` one per parameter
  ``key/<param name>``; other numeric fields -> scalars ``key/<field>``. 2-D histograms
  (``x_edges``/``y_edges``) have no TensorBoard form: only their scalar fields are written;
* any other 1-D or larger numeric array or list -> a histogram of its values;
* metrics of ``cp.log(step, name=value)`` -> scalar ``metrics/<name>``;
* the header -> text ``cockpit/header``; error records -> text ``cockpit/errors``;
  quantities added with ``cp.add`` -> text ``cockpit/quantities_added``. Records of other
  kinds are ignored.

NaN and inf scalars are written as they are (TensorBoard shows them as gaps/markers);
non-finite elements are dropped from histograms.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

INSTALL_HINT = (
    "The cockpit TensorBoard sink needs the 'tensorboard' package, which is not installed. "
    "Install it with: pip install tensorboard  (or: pip install cockpit-tensorboard)."
)


class TensorBoardConfig(BaseModel):
    """Options of the ``tensorboard`` sink."""

    model_config = ConfigDict(extra="forbid")

    log_dir: str = Field(
        "runs/tensorboard", description="Folder of the event files (tensorboard --logdir ...)."
    )
    flush_secs: int = Field(10, ge=1, description="Seconds between flushes of the event file.")
    histograms: bool = Field(True, description="Write arrays and binned histograms.")
    per_param: bool = Field(
        True, description="Write one scalar per parameter for per-parameter values."
    )


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    return SummaryWriter


class TensorBoardSink:
    """A cockpit sink writing TensorBoard events; build it with the options of the config.

    Args:
        log_dir: Folder of the event files.
        flush_secs: Seconds between flushes.
        histograms: Write arrays and binned histograms.
        per_param: One scalar per parameter for ``{"total", "per_param"}`` values.

    Raises:
        ImportError: ``tensorboard`` is not installed (the message says what to install).

    """

    def __init__(
        self,
        log_dir: str = "runs/tensorboard",
        flush_secs: int = 10,
        histograms: bool = True,
        per_param: bool = True,
    ):
        self.writer = _summary_writer()(log_dir=str(log_dir), flush_secs=flush_secs)
        self.log_dir = str(log_dir)
        self.histograms = histograms
        self.per_param = per_param
        self.param_names: list[str] = []

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Write one cockpit record."""
        kind = record.get("kind")
        if kind == "header":
            self.param_names = [str(p.get("name")) for p in record.get("params", [])]
            text = json.dumps({k: v for k, v in record.items() if k != "kind"}, default=str)
            self.writer.add_text("cockpit/header", f"```\n{text}\n```", 0)
        elif kind == "values":
            step = int(record["step"])
            for key, value in record["values"].items():
                self._value(str(key), value, step)
        elif kind == "metrics":
            step = int(record["step"])
            for name, value in record["metrics"].items():
                if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"metrics/{name}", float(value), step)
        elif kind == "quantity_added":
            quantity = record.get("quantity") or {}
            self.writer.add_text(
                "cockpit/quantities_added",
                f"{quantity.get('key')}: tracked from step {record.get('step')}",
                int(record.get("step", 0)),
            )
        elif kind == "error":
            self.writer.add_text(
                "cockpit/errors",
                f"{record.get('quantity')}: {record.get('error')}",
                int(record.get("step", 0)),
            )

    def _value(self, tag: str, value: Any, step: int) -> None:
        if value is None or isinstance(value, str):
            return
        if isinstance(value, (bool, int, float, np.number)):
            self.writer.add_scalar(tag, float(value), step)
            return
        if isinstance(value, Mapping):
            if "hist" in value:
                self._histogram_dict(tag, value, step)
                return
            for field, sub in value.items():
                if field == "per_param":
                    if self.per_param:
                        self._per_param(tag, sub, step)
                else:
                    self._value(f"{tag}/{field}", sub, step)
            return
        array = np.asarray(value, dtype=object if isinstance(value, list) else None)
        if array.dtype == object:
            try:
                array = np.asarray(value, dtype=float)
            except (TypeError, ValueError):  # ragged lists: one entry per parameter
                for i, sub in enumerate(value):
                    self._value(f"{tag}/{self._pname(i)}", sub, step)
                return
        if array.ndim == 0:
            self.writer.add_scalar(tag, float(array), step)
        elif self.histograms:
            finite = array[np.isfinite(array)] if array.dtype.kind in "fc" else array
            if finite.size:
                self.writer.add_histogram(tag, finite.astype(float).ravel(), step)

    def _pname(self, i: int) -> str:
        return self.param_names[i] if i < len(self.param_names) else f"param_{i}"

    def _per_param(self, tag: str, values: Any, step: int) -> None:
        array = np.asarray(values, dtype=float)
        if array.ndim > 1:  # per-parameter arrays (not one number per parameter)
            for i, row in enumerate(array):
                self._value(f"{tag}/{self._pname(i)}", row, step)
            return
        for i, v in enumerate(np.atleast_1d(array)):
            self.writer.add_scalar(f"{tag}/{self._pname(i)}", float(v), step)

    def _histogram_dict(self, tag: str, value: Mapping[str, Any], step: int) -> None:
        """A histogram quantity: ``hist`` + ``edges`` (1-D) or ``x_edges``/``y_edges`` (2-D)."""
        counts = np.asarray(value["hist"])
        edges = value.get("edges")
        if edges is not None and counts.ndim == 1:
            self._binned(tag, counts, edges, step)
            per = value.get("per_param")
            if self.per_param and per is not None and np.ndim(per) == 2:
                for i, row in enumerate(np.asarray(per)):
                    self._binned(f"{tag}/{self._pname(i)}", row, edges, step)
        # 2-D histograms have no TensorBoard equivalent; their scalars are still written
        skip = {"hist", "edges", "x_edges", "y_edges", "per_param"}
        for field, sub in value.items():
            if field not in skip:
                self._value(f"{tag}/{field}", sub, step)

    def _binned(self, tag: str, counts: Any, edges: Any, step: int) -> None:
        counts = np.asarray(counts, dtype=float)
        edges = np.asarray(edges, dtype=float)
        if not self.histograms or counts.ndim != 1 or edges.shape != (counts.size + 1,):
            return
        if counts.sum() <= 0 or not np.isfinite(edges).all():
            return
        centers = (edges[1:] + edges[:-1]) / 2
        self.writer.add_histogram_raw(
            tag,
            min=float(edges[0]),
            max=float(edges[-1]),
            num=float(counts.sum()),
            sum=float((counts * centers).sum()),
            sum_squares=float((counts * centers**2).sum()),
            bucket_limits=edges[1:].tolist(),
            bucket_counts=counts.tolist(),
            global_step=step,
        )

    def flush(self) -> None:
        """Write pending events to disk."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardSink(log_dir={self.log_dir!r})"
