"""The MLflow sink: cockpit records -> metrics, tags and artifacts of an MLflow run.

Values become metrics named as described in :mod:`cockpit_core.log.scalars`, the same tags
as in TensorBoard and W&B (``cockpit/loss``, ``cockpit/grad_norm/total``,
``cockpit/grad_norm/<param>``), each at the record's step, with characters MLflow refuses
mapped by :func:`cockpit_mlflow.keys.metric_key`. Besides:

* metrics of ``cp.log(step, name=value)`` -> metrics ``cockpit/metrics/<name>``;
* the header -> tags ``cockpit.<field>`` (``cockpit.quantities``, ``cockpit.params``,
  ``cockpit.numel``, ``cockpit.cockpit_core``, ...), each value at most 5000 characters.
  Tags, not params: MLflow's params cannot change, and a second Cockpit logging into the
  same run, or ``cp.add``, changes ``cockpit.quantities``;
* at ``close()``: the dashboard as the artifact ``cockpit/dashboard.png`` and the whole
  cockpit log (every value, the histograms and errors included) as
  ``cockpit/cockpit.jsonl``, which ``cockpit plot`` reads.

MLflow has no histograms: 1-D histograms are not sent as metrics (the dashboard shows them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cockpit_dashboard import render
from pydantic import BaseModel, ConfigDict, Field

from cockpit_core import CockpitWarning
from cockpit_core.log import LogWriter
from cockpit_core.log.scalars import Scalar, TagMap, header_summary, quantity_entries
from cockpit_core.log.sink_kit import SinkFields, install_hint, missing_package
from cockpit_mlflow.keys import header_tags, metric_key, tag_value

INSTALL_HINT = install_hint("MLflow", "mlflow-skinny", "cockpit-mlflow", alternative="mlflow")
DEFAULT_EXPERIMENT_ID = "0"  # MLflow's "Default" experiment
FIELDS = SinkFields(verb="Log", noun="metric")


class MlflowConfig(BaseModel):
    """Options of the ``mlflow`` sink."""

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str | None = Field(
        None,
        description="Where runs are kept: 'file:./mlruns', 'http://host:5000', ... "
        "(default: MLflow's, MLFLOW_TRACKING_URI).",
    )
    experiment: str | None = Field(
        None,
        description="Experiment name of a run the sink starts, created if missing "
        "(default: MLFLOW_EXPERIMENT_NAME, else MLflow's Default experiment).",
    )
    run_name: str | None = Field(None, description="Name of a run the sink starts.")
    prefix: str = FIELDS.prefix()
    per_param: bool = FIELDS.per_param()
    per_param_max: int = FIELDS.per_param_max()
    dashboard: bool = Field(True, description="Log the dashboard as a PNG artifact at close().")
    dashboard_dpi: int = FIELDS.image_dpi(100, "Resolution of that PNG.")
    log_artifact: bool = Field(
        True, description="Log the cockpit log (.jsonl, every value) as an artifact at close()."
    )


def _mlflow() -> Any:
    with missing_package(INSTALL_HINT):
        import mlflow
    return mlflow


class MlflowSink:
    """A cockpit sink logging into an MLflow run: the script's active one, or one it starts.

    Args:
        tracking_uri: Where runs are kept (a ``file:`` folder, a server's URL, ...).
        run_id: Log into this existing run (never ended by the sink).
        experiment: Experiment name of a run the sink starts (created if missing).
        run_name: Name of a run the sink starts.
        prefix: First part of every metric and tag (``""`` for none).
        per_param: Log per-parameter metrics.
        per_param_max: Only for runs that track at most this many parameters.
        dashboard: The dashboard as a PNG artifact at :meth:`close`.
        dashboard_dpi: Resolution of that PNG.
        log_artifact: The cockpit log as an artifact at :meth:`close`.

    Without ``run_id``, the run of ``mlflow.start_run()`` active while the sink is built is
    used if ``tracking_uri`` is not given or is MLflow's current one; else the sink starts
    a run and ends it (``FINISHED``) at :meth:`close`. It ends no run it did not start.

    Raises:
        ImportError: MLflow is not installed (the message says what to install).
        ValueError: An option out of range.

    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        run_id: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        prefix: str = "cockpit",
        per_param: bool = True,
        per_param_max: int = 32,
        dashboard: bool = True,
        dashboard_dpi: int = 100,
        log_artifact: bool = True,
    ):
        options = MlflowConfig(
            tracking_uri=tracking_uri,
            experiment=experiment,
            run_name=run_name,
            prefix=prefix,
            per_param=per_param,
            per_param_max=per_param_max,
            dashboard=dashboard,
            dashboard_dpi=dashboard_dpi,
            log_artifact=log_artifact,
        )
        mlflow = _mlflow()
        from mlflow.entities import Metric, RunTag

        self._metric, self._tag = Metric, RunTag
        current_uri = mlflow.get_tracking_uri()
        self.client = mlflow.MlflowClient(tracking_uri=tracking_uri or current_uri)
        active = mlflow.active_run()
        if run_id is None and active is not None and tracking_uri in (None, current_uri):
            run_id = active.info.run_id
        self.owns_run = run_id is None
        if run_id is None:
            run_id = self._start(options)
        elif experiment is not None or run_name is not None:
            warnings.warn(
                "cockpit: the mlflow sink logs into the existing MLflow run; experiment and "
                "run_name apply only to a run the sink starts.",
                CockpitWarning,
                stacklevel=2,
            )
        self.run_id: str = run_id
        self.name = options.prefix.strip("/") or "cockpit"  # of the tags and artifacts
        self.tags = TagMap(options.prefix, per_param, per_param_max, histograms=False)
        self.dashboard_dpi = dashboard_dpi
        self.log_artifact = log_artifact
        self.dashboard = dashboard
        self._quantities: dict[str, dict[str, Any]] = {}
        self._tmp: Path | None = None
        self._log: LogWriter | None = None
        if dashboard or log_artifact:
            self._tmp = Path(tempfile.mkdtemp(prefix="cockpit-mlflow-"))
            self._log = LogWriter(self._tmp / "cockpit.jsonl", fsync_every=None)
        self._has_values = False
        self._closed = False

    def _start(self, options: MlflowConfig) -> str:
        name = options.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID", DEFAULT_EXPERIMENT_ID)
        if name:
            found = self.client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        run = self.client.create_run(experiment_id, run_name=options.run_name)
        run_id: str = run.info.run_id
        return run_id

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Log one cockpit record."""
        kind = record.get("kind")
        step = int(record.get("step", 0) or 0)
        if self._log is not None:
            self._log(dict(record))
        if kind == "header":
            self.tags.header(record)
            summary = header_summary(record)
            self._quantities = summary.get("quantities", {})
            self._set_tags(header_tags(self.name, summary))
        elif kind == "values":
            self._has_values = True
            events = self.tags.values(record["values"])
            self._log_metrics([e for e in events if isinstance(e, Scalar)], step)
        elif kind == "metrics":
            self._has_values = True
            self._log_metrics(list(self.tags.metrics(record["metrics"])), step)
        elif kind == "quantity_added":
            quantity = record.get("quantity") or {}
            self.tags.quantity_added(quantity)
            self._quantities.update(quantity_entries([{**quantity, "added_at": step}]))
            self._set_tags({metric_key(f"{self.name}.quantities"): tag_value(self._quantities)})

    def _log_metrics(self, scalars: list[Scalar], step: int) -> None:
        if scalars:
            now = int(time.time() * 1000)
            metrics = [self._metric(metric_key(s.tag), s.value, now, step) for s in scalars]
            self.client.log_batch(self.run_id, metrics=metrics)

    def _set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[self._tag(k, v) for k, v in tags.items()])

    def _dashboard(self, log: Path) -> Path | None:
        """Render the dashboard of the log; a failure warns and logs no picture."""
        path = log.with_name("dashboard.png")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a failing panel is shown in the picture
                render(str(log), path, dpi=self.dashboard_dpi)
        except Exception as err:  # plugin panels or matplotlib: the metrics are logged
            warnings.warn(
                f"cockpit: the mlflow sink could not render the dashboard ({err}; "
                f"{type(err).__name__}).",
                CockpitWarning,
                stacklevel=3,
            )
            return None
        return path

    def close(self) -> None:
        """Log the dashboard and the log as artifacts; end the run if the sink started it."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._log is not None and self._tmp is not None:
                self._log.close()
                log = Path(self._log.path)
                artifacts = [log] if self.log_artifact else []
                if self.dashboard and self._has_values:
                    artifacts += [p for p in [self._dashboard(log)] if p is not None]
                for path in artifacts:
                    self.client.log_artifact(self.run_id, str(path), artifact_path=self.name)
        finally:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
            if self.owns_run:
                self.client.set_terminated(self.run_id, "FINISHED")

    def __repr__(self) -> str:
        return f"MlflowSink(run_id={self.run_id!r})"
