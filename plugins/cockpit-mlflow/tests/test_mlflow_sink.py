"""The MLflow sink logs cockpit's tags into a local file store that reads back (issue 20).

Runs go to a ``file:`` tracking URI in ``tmp_path`` and are read back with MLflow's own
``MlflowClient`` (``get_metric_history``, ``get_run``, artifacts). MLflow keeps metric
values as float64, so they equal ``cp.get_output()`` exactly; against brute-force float64
recomputations the tolerance is 1e-12 (summation order only). MLflow 3 refuses the file
store unless ``MLFLOW_ALLOW_FILE_STORE`` is set; mlflow-skinny has no SQLite store.
"""

import json
import sys

import numpy as np
import pytest
import torch

mlflow = pytest.importorskip("mlflow")

from cockpit_mlflow import MlflowSink, metric_key  # noqa: E402
from cockpit_mlflow import plugin as mlflow_plugin  # noqa: E402
from cockpit_mlflow.keys import MAX_TAG_VALUE_LENGTH  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from cockpit_core import CockpitWarning, ConfigError, Registry  # noqa: E402
from cockpit_core.log import read_run  # noqa: E402
from cockpit_core.plugin.registry import default_registry  # noqa: E402
from cockpit_core.testing import run_cockpit, tiny_mlp  # noqa: E402

F64 = 1e-12


@pytest.fixture(scope="module", autouse=True)
def file_store_allowed():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        yield


def _history(client, run_id, key):
    metrics = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
    return [m.step for m in metrics], [m.value for m in metrics]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three SGD steps of the tiny MLP with a real Cockpit and the mlflow sink."""
    if not {"alpha", "time"} <= set(default_registry().quantities):
        pytest.skip("needs the quantities alpha and time")
    uri = tmp_path_factory.mktemp("mlruns").as_uri()
    sink = {"name": "mlflow", "tracking_uri": uri, "experiment": "tiny", "dashboard": False}
    result = run_cockpit(tiny_mlp(), ["loss", "grad_norm", "time", "alpha"], steps=3, sinks=[sink])
    (mlflow_sink,) = [s for s in result.cockpit.sinks if isinstance(s, MlflowSink)]
    result.cockpit.close()
    client = MlflowClient(uri)
    return result, client, client.get_run(mlflow_sink.run_id), tmp_path_factory.mktemp("dl")


def test_exact_metric_keys_and_a_finished_run(run):
    result, client, mlrun, _ = run
    names = result.cockpit.param_names
    expected = {"loss", "time", "grad_norm/total", "alpha/alpha", "alpha/exact"}
    expected |= {"alpha/step_length", *[f"grad_norm/{n}" for n in names]}
    assert set(mlrun.data.metrics) == {f"cockpit/{k}" for k in expected}
    assert mlrun.info.status == "FINISHED"  # the sink ended the run it started
    assert client.get_experiment(mlrun.info.experiment_id).name == "tiny"


def test_metrics_equal_the_brute_force_values_and_the_output(run):
    result, client, mlrun, _ = run
    output = result.cockpit.get_output()
    run_id = mlrun.info.run_id
    steps, loss = _history(client, run_id, "cockpit/loss")
    assert steps == [0, 1, 2]
    assert loss == [output[s]["loss"] for s in steps]
    for s in steps:
        x, y = result.problem.batch(s)
        expected = torch.nn.functional.cross_entropy(result.model_at(s)(x), y).item()
        np.testing.assert_allclose(loss[s], expected, rtol=F64)
    for i, name in enumerate(result.cockpit.param_names):
        norms = [torch.linalg.vector_norm(snap.grads[i]).item() for snap in result.snapshots]
        np.testing.assert_allclose(
            _history(client, run_id, f"cockpit/grad_norm/{name}")[1], norms, rtol=F64
        )
    total = [np.sqrt(sum(g.square().sum().item() for g in s.grads)) for s in result.snapshots]
    np.testing.assert_allclose(
        _history(client, run_id, "cockpit/grad_norm/total")[1], total, rtol=F64
    )
    elapsed = _history(client, run_id, "cockpit/time")[1]
    assert elapsed == [output[s]["time"] - output[0]["time"] for s in steps]  # float64
    alpha_steps, alpha = _history(client, run_id, "cockpit/alpha/alpha")
    assert alpha_steps == [0, 1]  # two-step: logged under the start step
    assert alpha == [output[s]["alpha"]["alpha"] for s in (0, 1)]


def test_the_header_becomes_bounded_tags(run):
    result, _, mlrun, _ = run
    tags = mlrun.data.tags
    assert tags["cockpit.params"] == str(len(result.cockpit.params))
    assert tags["cockpit.numel"] == str(sum(p.numel() for p in result.cockpit.params))
    quantities = json.loads(tags["cockpit.quantities"])
    assert quantities == {k: {"name": k} for k in ("loss", "grad_norm", "time", "alpha")}
    assert tags["cockpit.cockpit_core"] == result.cockpit.header()["cockpit_core"]
    assert not mlrun.data.params  # MLflow params cannot change: none are written


def test_the_cockpit_log_is_an_artifact(run):
    result, client, mlrun, dl = run
    artifacts = [a.path for a in client.list_artifacts(mlrun.info.run_id, "cockpit")]
    assert artifacts == ["cockpit/cockpit.jsonl"]  # dashboard=False
    path = client.download_artifacts(mlrun.info.run_id, "cockpit/cockpit.jsonl", str(dl))
    logged = read_run(path)
    output = result.cockpit.get_output()
    assert sorted(logged.output) == [0, 1, 2]
    assert logged.header["quantities"] == result.cockpit.header()["quantities"]
    for s, row in logged.output.items():
        assert row["loss"] == output[s]["loss"]
        np.testing.assert_array_equal(
            row["grad_norm"]["per_param"], output[s]["grad_norm"]["per_param"]
        )


def test_the_active_run_is_reused_and_left_open(tmp_path, monkeypatch):
    uri = (tmp_path / "store").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with mlflow.start_run() as active:
        mlflow.log_metric("train/accuracy", 0.5, step=0)
        result = run_cockpit(
            tiny_mlp(), ["loss"], steps=2, sinks=[{"name": "mlflow", "prefix": "cp"}]
        )
        result.cockpit.log(1, valid_accuracy=0.75)
        (sink,) = [s for s in result.cockpit.sinks if isinstance(s, MlflowSink)]
        sink({"kind": "quantity_added", "step": 2, "quantity": {"name": "time", "key": "clock"}})
        result.cockpit.close()
        assert sink.run_id == active.info.run_id and not sink.owns_run
        client = MlflowClient(uri)
        assert client.get_run(active.info.run_id).info.status == "RUNNING"
        mlflow.log_metric("train/accuracy", 0.625, step=1)
    mlrun = client.get_run(active.info.run_id)
    assert mlrun.info.status == "FINISHED"
    assert {"train/accuracy", "cp/loss", "cp/metrics/valid_accuracy"} == set(mlrun.data.metrics)
    assert _history(client, active.info.run_id, "cp/loss")[1] == [s.loss for s in result.snapshots]
    assert _history(client, active.info.run_id, "cp/metrics/valid_accuracy") == ([1], [0.75])
    quantities = json.loads(mlrun.data.tags["cp.quantities"])
    assert quantities == {"loss": {"name": "loss"}, "clock": {"name": "time", "added_at": 2}}
    artifacts = {a.path: a.file_size for a in client.list_artifacts(active.info.run_id, "cp")}
    assert set(artifacts) == {"cp/cockpit.jsonl", "cp/dashboard.png"}
    png = client.download_artifacts(active.info.run_id, "cp/dashboard.png", str(tmp_path))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n" and artifacts["cp/dashboard.png"] > 1000


@pytest.mark.parametrize(
    ("tag", "key"),
    [
        ("cockpit/grad_norm/0.weight", "cockpit/grad_norm/0.weight"),
        ("cockpit/norm/layers[0].weight", "cockpit/norm/layers_0_.weight"),
        ("cockpit/a:b/c d", "cockpit/a_b/c d"),
        ("cockpit//x/", "cockpit/x"),
        ("cockpit/./../y", "cockpit/_/__/y"),
        ("../up", "__/up"),
        ("...x", "_...x"),
        ("grad/ümlaut", "grad/_mlaut"),
        ("", "_"),
    ],
)
def test_metric_keys_follow_mlflows_rules(tag, key):
    assert metric_key(tag) == key


def test_odd_names_values_and_long_tags_reach_the_store(tmp_path):
    client = MlflowClient((tmp_path / "store").as_uri())
    sink = MlflowSink(client.tracking_uri, dashboard=False, log_artifact=False)
    params = [{"name": "layers[0].weight", "numel": 2}, {"name": "a:b", "numel": 1}]
    sink({"kind": "header", "params": params, "quantities": [], "note": "x" * 10000})
    long_key = "q" * 300
    values = {"norm": {"per_param": [3.0, 4.0]}, long_key: 1.0, "nan": float("nan"), "big": 10**400}
    sink({"kind": "values", "step": 4, "values": values})
    sink({"kind": "metrics", "step": 4, "metrics": {"flag": True, "acc": 0.5, "text": "no"}})
    sink.close()
    mlrun = client.get_run(sink.run_id)
    metrics = mlrun.data.metrics
    long_metric = metric_key(f"cockpit/{long_key}")
    assert len(long_metric) == 250 and long_metric != metric_key(f"cockpit/{long_key}x")
    expected = {"cockpit/norm/layers_0_.weight", "cockpit/norm/a_b", "cockpit/nan"}
    assert set(metrics) == expected | {long_metric, "cockpit/big", "cockpit/metrics/acc"}
    assert metrics["cockpit/norm/a_b"] == 4.0 and metrics[long_metric] == 1.0
    assert np.isnan(metrics["cockpit/nan"]) and metrics["cockpit/big"] == np.inf
    note = mlrun.data.tags["cockpit.note"]
    assert len(note) == MAX_TAG_VALUE_LENGTH and note.endswith("...(truncated)")


def test_options_are_validated_with_field_paths():
    with pytest.raises(ConfigError, match="sinks.mlflow.tracking_urii"):
        default_registry().make_sink({"name": "mlflow", "tracking_urii": "file:/tmp/x"})
    with pytest.raises(ConfigError, match="sinks.mlflow.dashboard_dpi"):
        default_registry().make_sink({"name": "mlflow", "dashboard_dpi": 1})


def test_register_sinks_hook_and_options_for_an_existing_run(tmp_path):
    registry = Registry()
    registry.add_plugin(mlflow_plugin, name="ml")
    assert registry.sinks["mlflow"].distribution == "<local>"
    uri = (tmp_path / "store").as_uri()
    sink = registry.make_sink({"name": "mlflow", "tracking_uri": uri, "log_artifact": False})
    assert isinstance(sink, MlflowSink) and sink.owns_run
    sink.close()  # nothing logged: no dashboard
    with pytest.warns(CockpitWarning, match="apply only to a run the sink starts"):
        other = MlflowSink(uri, run_id=sink.run_id, run_name="x", dashboard=False)
    other.close()
    assert not other.owns_run


def test_missing_mlflow_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match="pip install mlflow-skinny"):
        MlflowSink("file:/nonexistent")
