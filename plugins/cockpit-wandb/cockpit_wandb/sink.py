"""The W&B sink: cockpit records -> ``run.log({...}, step=step)`` of a Weights & Biases run.

Values become keys as described in :mod:`cockpit_core.log.scalars`, the same tags as in
TensorBoard (``cockpit/loss``, ``cockpit/grad_norm/total``, ``cockpit/grad_norm/<param>``,
the histogram ``cockpit/grad_hist_1d`` as a ``wandb.Histogram``). Besides:

* metrics of ``cp.log(step, name=value)`` -> ``cockpit/metrics/<name>``;
* the dashboard -> ``wandb.Image`` ``cockpit/dashboard`` at the first step, every
  ``image_every`` steps and at the end (rendered by :class:`cockpit_dashboard.LivePlot`);
* the header -> run config ``cockpit`` (the prefix): versions, plugins, quantities and
  their options, the number of parameters. Other records are not sent (the log has them).

W&B's step never decreases: a record for a step below the run's current step (the run
moved on through the script's own ``wandb.log`` calls) is dropped with one warning.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from cockpit_dashboard import LivePlot
from pydantic import BaseModel, ConfigDict, Field

from cockpit_core import CockpitWarning
from cockpit_core.log.scalars import Histogram, Scalar, TagMap, header_summary, quantity_entries
from cockpit_core.log.sink_kit import SinkFields, install_hint, missing_package

INSTALL_HINT = install_hint("W&B", "wandb", "cockpit-wandb")
MAX_HISTOGRAM_BINS = 512  # wandb.Histogram refuses more
Mode = Literal["online", "offline", "disabled"]
FIELDS = SinkFields(verb="Log", noun="key")


class WandbConfig(BaseModel):
    """Options of the ``wandb`` sink."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = Field(
        None, description="W&B project of a run the sink starts (default: W&B's)."
    )
    name: str | None = Field(None, description="Display name of a run the sink starts.")
    dir: str | None = Field(
        None, description="Folder for W&B's run files of a run the sink starts (created)."
    )
    mode: Mode | None = Field(
        None,
        description="'online', 'offline' or 'disabled' for a run the sink starts "
        "(default: WANDB_MODE, else online).",
    )
    prefix: str = FIELDS.prefix()
    image_every: int = FIELDS.image_every()
    image_dpi: int = FIELDS.image_dpi()
    histograms: bool = FIELDS.histograms()
    per_param: bool = FIELDS.per_param()
    per_param_max: int = FIELDS.per_param_max()


def _wandb() -> Any:
    with missing_package(INSTALL_HINT):
        import wandb
    return wandb


class WandbSink:
    """A cockpit sink logging into a W&B run: the script's own, or one it starts.

    Args:
        project: Project of a run the sink starts.
        run: A W&B run to log into (default: ``wandb.run`` if the script started one).
            The sink never finishes a run it did not start.
        name: Display name of a run the sink starts.
        dir: Folder of W&B's files of a run the sink starts.
        mode: ``"online"``, ``"offline"`` or ``"disabled"`` for a run the sink starts.
        prefix: First part of every key (``""`` for none).
        image_every: Dashboard image at the first step, every N steps and at the end
            (0: never).
        image_dpi: Resolution of the dashboard image.
        histograms: Log 1-D histograms (at most 512 bins, W&B's limit).
        per_param: Log per-parameter keys.
        per_param_max: Only for runs that track at most this many parameters.

    Raises:
        ImportError: ``wandb`` is not installed (the message says what to install).
        ValueError: An option out of range.

    """

    def __init__(
        self,
        project: str | None = None,
        *,
        run: Any = None,
        name: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        mode: Mode | None = None,
        prefix: str = "cockpit",
        image_every: int = 0,
        image_dpi: int = 60,
        histograms: bool = True,
        per_param: bool = True,
        per_param_max: int = 32,
    ):
        options = WandbConfig(
            project=project,
            name=name,
            dir=None if dir is None else str(dir),
            mode=mode,
            prefix=prefix,
            image_every=image_every,
            image_dpi=image_dpi,
            histograms=histograms,
            per_param=per_param,
            per_param_max=per_param_max,
        )
        self.wandb = _wandb()
        self.run = run if run is not None else self.wandb.run
        self.owns_run = self.run is None
        if self.run is None:
            self.run = self._init(options)
        elif project is not None or name is not None or dir is not None or mode is not None:
            warnings.warn(
                "cockpit: the wandb sink logs into the existing W&B run; project, name, dir "
                "and mode apply only to a run the sink starts.",
                CockpitWarning,
                stacklevel=2,
            )
        self.config_key = options.prefix.strip("/") or "cockpit"
        self.tags = TagMap(options.prefix, per_param, per_param_max, histograms)
        self.dropped = 0  # records W&B could not take: their step was below the run's
        self._tmp: Path | None = None
        self.images: LivePlot | None = None
        if image_every:
            self._tmp = Path(tempfile.mkdtemp(prefix="cockpit-wandb-"))
            self.images = LivePlot(self._tmp / "dashboard.png", image_every, dpi=image_dpi)
        self._newest = 0
        self._closed = False

    def _init(self, options: WandbConfig) -> Any:
        kwargs = {"project": options.project, "name": options.name, "mode": options.mode}
        if options.dir is not None:
            Path(options.dir).mkdir(parents=True, exist_ok=True)
            kwargs["dir"] = options.dir
        return self.wandb.init(**{k: v for k, v in kwargs.items() if v is not None})

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Log one cockpit record."""
        kind = record.get("kind")
        step = int(record.get("step", 0) or 0)
        if kind == "header":
            self.tags.header(record)
            self.run.config.update({self.config_key: header_summary(record)}, allow_val_change=True)
        elif kind == "values":
            self._newest = max(self._newest, step)
            data = {e.tag: self._media(e) for e in self.tags.values(record["values"])}
            self._log({k: v for k, v in data.items() if v is not None}, step)
        elif kind == "metrics":
            self._log({e.tag: e.value for e in self.tags.metrics(record["metrics"])}, step)
        elif kind == "quantity_added":
            self.tags.quantity_added(record.get("quantity") or {})
            self._update_quantities(record)
        if self.images is not None:
            renders = self.images.renders
            self._render(record)
            if self.images is not None and self.images.renders > renders:
                self._log_image()

    def _media(self, event: Scalar | Histogram) -> Any:
        if isinstance(event, Scalar):
            return event.value
        if event.counts.size > MAX_HISTOGRAM_BINS or event.counts.sum() <= 0:
            return None
        return self.wandb.Histogram(np_histogram=(event.counts.tolist(), event.edges.tolist()))

    def _log(self, data: dict[str, Any], step: int) -> None:
        if not data:
            return
        current = int(getattr(self.run, "step", 0) or 0)
        if step < current:  # W&B would drop it with a message of its own
            self.dropped += 1
            if self.dropped == 1:
                warnings.warn(
                    f"cockpit: the wandb sink cannot log step {step}: the W&B run is at step "
                    f"{current} already, and W&B's step never decreases. Log your own values "
                    "with wandb.log(..., step=step); the cockpit log keeps every value.",
                    CockpitWarning,
                    stacklevel=3,
                )
            return
        self.run.log(data, step=step)

    def _update_quantities(self, record: Mapping[str, Any]) -> None:
        cockpit = dict(self.run.config.get(self.config_key) or {})
        entry = {**(record.get("quantity") or {}), "added_at": record.get("step")}
        cockpit["quantities"] = {**(cockpit.get("quantities") or {}), **quantity_entries([entry])}
        self.run.config.update({self.config_key: cockpit}, allow_val_change=True)

    def _render(self, record: Mapping[str, Any] | None) -> None:
        """Feed the dashboard a record (``None``: close it); a failure turns images off."""
        assert self.images is not None
        try:
            self.images.close() if record is None else self.images(dict(record))
        except Exception as err:  # plugin panels or matplotlib: keep logging the scalars
            self.images = None
            warnings.warn(
                f"cockpit: the wandb sink could not render the dashboard ({err}; "
                f"{type(err).__name__}); it logs no more images.",
                CockpitWarning,
                stacklevel=3,
            )

    def _log_image(self) -> None:
        from PIL import Image

        assert self.images is not None
        with Image.open(self.images.path) as picture:  # W&B may read a path later: copy it
            image = self.wandb.Image(picture.convert("RGB"))
        step = max(self._newest, int(getattr(self.run, "step", 0) or 0))
        self.run.log({self.tags.tag("dashboard"): image}, step=step)

    def close(self) -> None:
        """Log the last dashboard image; finish the run only if the sink started it."""
        if self._closed:
            return
        self._closed = True
        if self.images is not None:
            renders = self.images.renders
            self._render(None)
            if self.images is not None and self.images.renders > renders:
                self._log_image()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if self.owns_run:
            self.run.finish()

    def __repr__(self) -> str:
        return f"WandbSink(run={getattr(self.run, 'id', None)!r})"
