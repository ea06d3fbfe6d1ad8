"""The TensorBoard sink: cockpit records -> curated TensorBoard scalars, histograms, images.

Values become tags as described in :mod:`cockpit_tensorboard.tags` (``cockpit/loss``,
``cockpit/grad_norm/total``, ``cockpit/grad_norm/<param>``, the histogram
``cockpit/grad_hist_1d``, ...). Besides:

* metrics of ``cp.log(step, name=value)`` -> scalars ``cockpit/metrics/<name>``;
* the dashboard -> image ``cockpit/dashboard`` every ``image_every`` steps and at the end;
* the header -> text ``cockpit/header``; error records -> text ``cockpit/errors``; skipped
  steps -> text ``cockpit/skipped``; quantities added with ``cp.add`` -> text
  ``cockpit/quantities_added``. Records of other kinds are ignored.

Wall time is not a scalar: every TensorBoard event carries its own.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cockpit_core import CockpitWarning
from cockpit_core.log.sink_kit import SinkFields, install_hint, missing_package
from cockpit_tensorboard.dashboard_image import DashboardImages
from cockpit_tensorboard.tags import Histogram, Scalar, TagMap

INSTALL_HINT = install_hint("TensorBoard", "tensorboard", "cockpit-tensorboard")
DEFAULT_LOG_DIR = "runs/tensorboard"
WRITER_METHODS = ("add_scalar", "add_histogram_raw", "add_image", "add_text", "flush")
FIELDS = SinkFields(verb="Write", noun="tag")


class TensorBoardConfig(BaseModel):
    """Options of the ``tensorboard`` sink."""

    model_config = ConfigDict(extra="forbid")

    log_dir: str = Field(
        DEFAULT_LOG_DIR, description="Folder of the event files (tensorboard --logdir ...)."
    )
    prefix: str = FIELDS.prefix()
    image_every: int = FIELDS.image_every()
    image_dpi: int = FIELDS.image_dpi()
    flush_secs: int = Field(10, ge=1, description="Seconds between flushes of the event file.")
    histograms: bool = FIELDS.histograms()
    per_param: bool = FIELDS.per_param()
    per_param_max: int = FIELDS.per_param_max()


def _summary_writer() -> Any:
    with missing_package(INSTALL_HINT):
        from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter


class TensorBoardSink:
    """A cockpit sink writing TensorBoard events into its own or the user's ``SummaryWriter``.

    Args:
        log_dir: Folder of the event files of a writer the sink opens (and closes).
            Default ``runs/tensorboard``.
        writer: An open ``SummaryWriter`` (or one with the same methods) to write into
            instead, e.g. the training script's own, so cockpit's tags land in that run.
            The sink flushes it but never closes it. Not together with ``log_dir``.
        prefix: First part of every tag (``""`` for none).
        image_every: Dashboard image every N steps and at the end (0: never).
        image_dpi: Resolution of the dashboard image.
        flush_secs: Seconds between flushes of a writer the sink opens.
        histograms: Write 1-D histograms.
        per_param: Write per-parameter tags.
        per_param_max: Only for runs that track at most this many parameters.

    Raises:
        ImportError: ``tensorboard`` is not installed (the message says what to install).
        ValueError: Both ``log_dir`` and ``writer``, or an option out of range.
        TypeError: ``writer`` lacks a method the sink calls.

    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        writer: Any = None,
        prefix: str = "cockpit",
        image_every: int = 0,
        image_dpi: int = 60,
        flush_secs: int = 10,
        histograms: bool = True,
        per_param: bool = True,
        per_param_max: int = 32,
    ):
        if writer is not None and log_dir is not None:
            raise ValueError("TensorBoardSink: give log_dir or writer, not both.")
        options = TensorBoardConfig(
            log_dir=str(log_dir if log_dir is not None else DEFAULT_LOG_DIR),
            prefix=prefix,
            image_every=image_every,
            image_dpi=image_dpi,
            flush_secs=flush_secs,
            histograms=histograms,
            per_param=per_param,
            per_param_max=per_param_max,
        )
        if writer is None:
            self.writer = _summary_writer()(log_dir=options.log_dir, flush_secs=flush_secs)
            self.owns_writer = True
        else:
            missing = [m for m in WRITER_METHODS if not callable(getattr(writer, m, None))]
            if missing:
                raise TypeError(
                    f"TensorBoardSink: writer {writer!r} has no {', '.join(missing)}; "
                    "pass a torch.utils.tensorboard.SummaryWriter."
                )
            self.writer = writer
            self.owns_writer = False
        self.log_dir = str(getattr(self.writer, "log_dir", options.log_dir))
        self.tags = TagMap(options.prefix, per_param, per_param_max, histograms)
        self.images = DashboardImages(image_every, image_dpi) if image_every else None
        self._closed = False

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Write one cockpit record."""
        kind = record.get("kind")
        step = int(record.get("step", 0) or 0)
        if kind == "header":
            self.tags.header(record)
            self._header_text(record)
        elif kind == "values":
            for event in self.tags.values(record["values"]):
                self._write(event, step)
        elif kind == "metrics":
            for name, value in record["metrics"].items():
                if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
                    self.writer.add_scalar(self.tags.tag("metrics", str(name)), float(value), step)
        elif kind == "quantity_added":
            quantity = record.get("quantity") or {}
            self.tags.quantity_added(quantity)
            self._text("quantities_added", f"{quantity.get('key')}: tracked from step {step}", step)
        elif kind == "error":
            self._text("errors", f"{record.get('quantity')}: {record.get('error')}", step)
        elif kind == "skipped":
            self._text("skipped", f"{record.get('quantities')}: {record.get('reason')}", step)
        if self.images is not None:
            due = self.images.add(record)
            if due is not None:
                self._image(due)

    def _header_text(self, record: Mapping[str, Any]) -> None:
        text = json.dumps({k: v for k, v in record.items() if k != "kind"}, default=str)
        params = len(self.tags.param_names)
        if self.tags.per_param and not self.tags.writes_per_param:
            text += (
                f"\n\nper-parameter tags: off ({params} parameters > per_param_max="
                f"{self.tags.per_param_max})"
            )
        self._text("header", f"```\n{text}\n```", 0)

    def _text(self, name: str, text: str, step: int) -> None:
        self.writer.add_text(self.tags.tag(name), text, step)

    def _write(self, event: Scalar | Histogram, step: int) -> None:
        if isinstance(event, Scalar):
            self.writer.add_scalar(event.tag, event.value, step)
            return
        counts, edges = event.counts, event.edges
        if counts.sum() <= 0:  # nothing binned: TensorBoard has no empty histogram
            return
        centers = (edges[1:] + edges[:-1]) / 2
        self.writer.add_histogram_raw(
            event.tag,
            min=float(edges[0]),
            max=float(edges[-1]),
            num=float(counts.sum()),
            sum=float((counts * centers).sum()),
            sum_squares=float((counts * centers**2).sum()),
            bucket_limits=edges[1:].tolist(),
            bucket_counts=counts.tolist(),
            global_step=step,
        )

    def _image(self, step: int) -> None:
        """Write the dashboard; a failure turns images off (with a warning), not the sink."""
        assert self.images is not None
        try:
            image = self.images.image()
        except Exception as err:  # plugin panels or matplotlib: keep writing the scalars
            self.images = None
            warnings.warn(
                f"cockpit: the tensorboard sink could not render the dashboard ({err}; "
                f"{type(err).__name__}); it writes no more images.",
                CockpitWarning,
                stacklevel=2,
            )
            return
        self.writer.add_image(self.tags.tag("dashboard"), image, step, dataformats="HWC")

    def flush(self) -> None:
        """Write pending events to disk."""
        self.writer.flush()

    def close(self) -> None:
        """Write the last dashboard image, flush, and close the writer if the sink opened it."""
        if self._closed:
            return
        self._closed = True
        if self.images is not None:
            step = self.images.final_step()
            if step is not None:
                self._image(step)
        self.writer.flush()
        if self.owns_writer:
            self.writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardSink(log_dir={self.log_dir!r})"
