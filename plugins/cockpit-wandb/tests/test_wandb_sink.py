"""The W&B sink logs cockpit's tags into an offline run whose files read back (issue 20).

Runs are offline (no network) in ``tmp_path``. The ``.wandb`` file is a LevelDB-style log
of ``wandb_internal_pb2.Record`` protobufs (32 KiB blocks, 7-byte chunk headers after a
7-byte W&B header); wandb has no public reader for it any more, so :func:`_records` undoes
the framing and wandb's own protobuf classes decode the records. W&B keeps numbers as
float64 JSON, so values read back equal ``cp.get_output()`` exactly; against brute-force
float64 recomputations the tolerance is 1e-12 (summation order only).
"""

import json
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

wandb = pytest.importorskip("wandb")

from cockpit_wandb import WandbSink  # noqa: E402
from cockpit_wandb import plugin as wandb_plugin  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402

from cockpit_core import CockpitWarning, ConfigError, Registry  # noqa: E402
from cockpit_core.plugin.registry import default_registry  # noqa: E402
from cockpit_core.testing import run_cockpit, tiny_mlp  # noqa: E402

F64 = 1e-12
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@pytest.fixture(scope="module", autouse=True)
def offline_wandb(tmp_path_factory):
    """W&B quiet, offline and with its config and caches in a temporary folder."""
    home = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_CONSOLE", "off")
        mp.setenv("WANDB_MODE", "offline")
        for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(var, str(home))
        yield
        if wandb.run is not None:
            wandb.run.finish()
        wandb.teardown()  # stops W&B's service process


def _records(path):
    """The protobuf records of a ``.wandb`` file (LevelDB log framing)."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding up to the end of the block
            pos += BLOCK - pos % BLOCK
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _nest(target, keys, value):
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value


def _read_run(root):
    """``({step: {key: value}}, config, run folder)`` of the one offline run under ``root``.

    W&B's service may still be writing the file after ``finish()`` returned; ``teardown``
    waits until it has stopped.
    """
    wandb.teardown()
    (path,) = Path(root).glob("wandb/offline-run-*/run-*.wandb")
    rows, config = {}, {}
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = rows.setdefault(record.history.step.num, {})
            for item in record.history.item:
                _nest(row, list(item.nested_key) or [item.key], json.loads(item.value_json))
        elif kind == "config":
            for item in record.config.update:
                _nest(config, list(item.nested_key) or [item.key], json.loads(item.value_json))
    return rows, config, path.parent


def _cockpit_keys(row):
    return {k for k in row if not k.startswith("_")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three SGD steps of the tiny MLP with a real Cockpit and the wandb sink."""
    needed = {"alpha", "grad_hist_1d", "time"}
    if not needed <= set(default_registry().quantities):
        pytest.skip(f"needs the quantities {sorted(needed)}")
    root = tmp_path_factory.mktemp("wb")
    quantities = ["loss", "grad_norm", "time", "alpha", {"name": "grad_hist_1d", "bins": 12}]
    sink = {"name": "wandb", "mode": "offline", "dir": str(root), "project": "cockpit-test"}
    result = run_cockpit(tiny_mlp(), quantities, steps=3, sinks=[sink])
    result.cockpit.close()
    assert wandb.run is None  # the sink finished the run it started
    return (result, *_read_run(root))


def test_exact_keys_of_a_training_run(run):
    result, rows, _, _ = run
    names = result.cockpit.param_names
    scalars = {
        "loss",
        "time",
        "grad_norm/total",
        "grad_hist_1d/grad_abs_max",
        "grad_hist_1d/nonfinite/nan",
        "grad_hist_1d/nonfinite/posinf",
        "grad_hist_1d/nonfinite/neginf",
        *[f"grad_norm/{n}" for n in names],
    }
    hists = {"grad_hist_1d", *[f"grad_hist_1d/{n}" for n in names]}
    alpha = {"alpha/alpha", "alpha/exact", "alpha/step_length"}  # from the start step on
    assert sorted(rows) == [0, 1, 2]
    for step, row in rows.items():
        keys = scalars | hists | (alpha if step < 2 else set())
        assert _cockpit_keys(row) == {f"cockpit/{k}" for k in keys}
        assert row["_step"] == step


def test_values_equal_the_brute_force_values_and_the_output(run):
    result, rows, _, _ = run
    output = result.cockpit.get_output()
    for s, snap in enumerate(result.snapshots):
        row = rows[s]
        batch = result.problem.batch(s)
        loss = torch.nn.functional.cross_entropy(result.model_at(s)(batch[0]), batch[1])
        np.testing.assert_allclose(row["cockpit/loss"], loss.item(), rtol=F64)
        assert row["cockpit/loss"] == output[s]["loss"]
        total = np.sqrt(sum(g.square().sum().item() for g in snap.grads))
        np.testing.assert_allclose(row["cockpit/grad_norm/total"], total, rtol=F64)
        for i, name in enumerate(result.cockpit.param_names):
            norm = torch.linalg.vector_norm(snap.grads[i]).item()
            np.testing.assert_allclose(row[f"cockpit/grad_norm/{name}"], norm, rtol=F64)
        assert row["cockpit/time"] == output[s]["time"] - output[0]["time"]  # float64
        hist = output[s]["grad_hist_1d"]
        assert row["cockpit/grad_hist_1d"]["_type"] == "histogram"
        assert row["cockpit/grad_hist_1d"]["values"] == hist["hist"].tolist()
        assert row["cockpit/grad_hist_1d"]["bins"] == hist["edges"].tolist()
        numel = sum(p.numel() for p in result.cockpit.params)
        assert sum(row["cockpit/grad_hist_1d"]["values"]) == result.problem.batch_size * numel
    for s in (0, 1):  # alpha of step s arrives at step s + 1, before that step's values
        assert rows[s]["cockpit/alpha/alpha"] == output[s]["alpha"]["alpha"]
        assert rows[s]["cockpit/alpha/exact"] == float(output[s]["alpha"]["exact"])


def test_the_header_is_the_run_config(run):
    result, _, config, _ = run
    cockpit = config["cockpit"]
    assert cockpit["params"] == len(result.cockpit.params)
    assert cockpit["numel"] == sum(p.numel() for p in result.cockpit.params)
    assert cockpit["quantities"]["grad_hist_1d"] == {"name": "grad_hist_1d", "bins": 12}
    assert set(cockpit["quantities"]) == {"loss", "grad_norm", "time", "alpha", "grad_hist_1d"}
    assert cockpit["cockpit_core"] == result.cockpit.header()["cockpit_core"]


def test_the_users_run_gets_the_keys_and_images_and_stays_open(tmp_path):
    user_run = wandb.init(mode="offline", dir=str(tmp_path), project="mine")
    user_run.log({"train/accuracy": 0.5}, step=0)
    sink = WandbSink(prefix="cp", image_every=2, image_dpi=20)
    assert sink.run is user_run and not sink.owns_run
    result = run_cockpit(tiny_mlp(), ["loss"], steps=4, sinks=[sink])
    result.cockpit.log(3, valid_accuracy=0.75)
    sink({"kind": "quantity_added", "step": 3, "quantity": {"name": "time", "key": "clock"}})
    result.cockpit.close()
    assert wandb.run is user_run  # not finished by the sink
    user_run.log({"train/accuracy": 0.625}, step=5)
    with pytest.warns(CockpitWarning, match="cannot log step 4: the W&B run is at step 5"):
        sink({"kind": "values", "step": 4, "values": {"loss": 1.0}})
    assert sink.dropped == 1
    user_run.finish()
    rows, config, run_dir = _read_run(tmp_path)
    assert rows[0]["train/accuracy"] == 0.5 and rows[5]["train/accuracy"] == 0.625
    loss = [rows[s]["cp/loss"] for s in range(4)]
    assert loss == [snap.loss for snap in result.snapshots]
    assert rows[3]["cp/metrics/valid_accuracy"] == 0.75
    assert "cp/loss" not in rows[5]
    # images at the first step, 2 steps later, and at close (a newer step and a metric)
    images = {s: row["cp/dashboard"] for s, row in rows.items() if "cp/dashboard" in row}
    assert sorted(images) == [0, 2, 3]
    for image in images.values():
        assert image["_type"] == "image-file" and image["width"] > 50 and image["height"] > 50
        assert (run_dir / "files" / image["path"]).stat().st_size == image["size"]
    assert config["cp"]["quantities"]["clock"] == {"name": "time", "added_at": 3}


def test_options_are_validated_with_field_paths(tmp_path):
    with pytest.raises(ConfigError, match="sinks.wandb.modee"):
        default_registry().make_sink({"name": "wandb", "modee": "offline"})
    with pytest.raises(ConfigError, match="sinks.wandb.mode"):
        default_registry().make_sink({"name": "wandb", "mode": "offlin"})
    with pytest.raises(ConfigError, match="sinks.wandb.image_every"):
        default_registry().make_sink({"name": "wandb", "image_every": -1})


def test_register_sinks_hook_of_this_plugin(tmp_path):
    registry = Registry()
    registry.add_plugin(wandb_plugin, name="wb")
    assert registry.sinks["wandb"].distribution == "<local>"
    sink = registry.make_sink({"name": "wandb", "mode": "disabled", "dir": str(tmp_path)})
    assert isinstance(sink, WandbSink) and sink.owns_run
    sink({"kind": "header", "params": [{"name": "w", "numel": 3}], "quantities": []})
    sink({"kind": "values", "step": 0, "values": {"loss": 1.0}})
    sink.close()
    assert wandb.run is None


def test_options_for_a_run_that_exists_warn(tmp_path):
    user_run = wandb.init(mode="disabled")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        WandbSink(run=user_run).close()  # no run options: no warning
    assert not [w for w in caught if issubclass(w.category, CockpitWarning)]
    with pytest.warns(CockpitWarning, match="apply only to a run the sink starts"):
        WandbSink(project="other", run=user_run).close()
    user_run.finish()


def test_missing_wandb_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match="pip install wandb"):
        WandbSink(mode="disabled")


class RecordingRun:
    """Stands in for a W&B run: keeps what ``log`` got, W&B's step rule included."""

    def __init__(self):
        self.step, self.rows = 0, {}

    def log(self, data, step):
        assert step >= self.step
        self.step = step
        self.rows.setdefault(step, {}).update(data)


def test_histograms_wider_than_wandb_allows_are_left_out():
    fake = RecordingRun()
    sink = WandbSink(run=fake)
    narrow = {"hist": np.array([1, 2]), "edges": np.array([0.0, 1.0, 2.0])}
    wide = {"hist": np.ones(513), "edges": np.linspace(0.0, 1.0, 514), "grad_abs_max": 1.0}
    sink({"kind": "values", "step": 2, "values": {"narrow": narrow, "wide": wide}})
    sink.close()
    assert set(fake.rows[2]) == {"cockpit/narrow", "cockpit/wide/grad_abs_max"}
    assert fake.rows[2]["cockpit/narrow"].histogram == [1, 2]
    assert fake.rows[2]["cockpit/narrow"].bins == [0.0, 1.0, 2.0]
