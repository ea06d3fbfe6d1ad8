"""The TensorBoard sink writes events that TensorBoard's own reader reads back (issue 5)."""

import sys

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from cockpit_tensorboard import TensorBoardSink  # noqa: E402
from cockpit_tensorboard import plugin as tb_plugin  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from cockpit_core import ConfigError, Registry, UnknownQuantityError  # noqa: E402
from cockpit_core.registry import default_registry  # noqa: E402
from cockpit_core.testing import run_cockpit, tiny_mlp  # noqa: E402


def _accumulate(log_dir):
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def test_a_training_run_is_read_back_by_tensorboard(tmp_path):
    log_dir = tmp_path / "tb"
    quantities = ["loss", "grad_norm"]
    histograms = "grad_hist_1d" in default_registry().quantities  # from cockpit-histograms
    if histograms:
        quantities.append("grad_hist_1d")
    result = run_cockpit(
        tiny_mlp(),
        quantities,
        steps=4,
        sinks=[{"name": "tensorboard", "log_dir": str(log_dir)}],
    )
    result.cockpit.close()
    acc = _accumulate(log_dir)
    tags = acc.Tags()
    names = result.cockpit.param_names
    assert {"loss", "grad_norm/total"} <= set(tags["scalars"])
    assert {f"grad_norm/{n}" for n in names} <= set(tags["scalars"])
    output = result.output
    # TensorBoard stores scalars as float32: compare at float32 precision
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [0, 1, 2, 3]
    np.testing.assert_allclose(
        [e.value for e in loss], [output[s]["loss"] for s in range(4)], rtol=1e-6
    )
    per = acc.Scalars(f"grad_norm/{names[1]}")
    np.testing.assert_allclose(
        [e.value for e in per],
        [output[s]["grad_norm"]["per_param"][1] for s in range(4)],
        rtol=1e-6,
    )
    assert "cockpit/header/text_summary" in tags["tensors"]
    if histograms:
        hist = acc.Histograms("grad_hist_1d")
        assert [h.step for h in hist] == [0, 1, 2, 3]
        counts = output[3]["grad_hist_1d"]["hist"]
        assert hist[-1].histogram_value.num == counts.sum()
        assert f"grad_hist_1d/{names[0]}" in tags["histograms"]


def test_arrays_and_binned_histograms_become_tensorboard_histograms(tmp_path):
    sink = TensorBoardSink(log_dir=str(tmp_path))
    sink({"kind": "header", "params": [{"name": "w"}, {"name": "b"}]})
    counts = np.array([1.0, 4.0, 10.0, 4.0, 1.0])
    edges = np.linspace(-1, 1, 6)
    values = {
        "grad_hist_1d": {
            "hist": counts,
            "edges": edges,
            "per_param": np.stack([counts, 2 * counts]),
            "nonfinite": {"nan": 0, "posinf": 1, "neginf": 0},
            "grad_abs_max": 0.9,
        },
        "samples": np.array([0.5, 1.5, np.nan, 2.5]),
        "per_layer_hist": [{"hist": counts, "edges": edges}, {"hist": 2 * counts, "edges": edges}],
        "hist_2d": {
            "hist": np.ones((3, 3)),
            "x_edges": np.arange(4.0),
            "y_edges": np.arange(4.0),
            "grad_abs_max": 2.0,
        },
        "nan_scalar": float("nan"),
    }
    sink({"kind": "values", "step": 7, "values": values})
    sink({"kind": "error", "step": 7, "quantity": "x", "error": "ValueError: boom"})
    sink.close()
    acc = _accumulate(tmp_path)
    tags = acc.Tags()
    assert {"grad_hist_1d", "samples", "per_layer_hist/w", "per_layer_hist/b"} <= set(
        tags["histograms"]
    )
    assert {"grad_hist_1d/w", "grad_hist_1d/b"} <= set(tags["histograms"])
    assert not [t for t in tags["histograms"] if t.startswith("hist_2d")]  # no 2-D in TB
    assert {"hist_2d/grad_abs_max", "grad_hist_1d/nonfinite/posinf"} <= set(tags["scalars"])
    assert acc.Histograms("grad_hist_1d/b")[0].histogram_value.num == 2 * counts.sum()
    hist = acc.Histograms("grad_hist_1d")[0]
    assert hist.step == 7
    assert hist.histogram_value.num == counts.sum()
    assert list(hist.histogram_value.bucket) == counts.tolist()
    assert list(hist.histogram_value.bucket_limit) == pytest.approx(edges[1:].tolist())
    samples = acc.Histograms("samples")[0].histogram_value
    assert samples.num == 3 and samples.min == 0.5 and samples.max == 2.5  # NaN dropped
    assert np.isnan(acc.Scalars("nan_scalar")[0].value)
    assert "cockpit/errors/text_summary" in tags["tensors"]


def test_options_are_validated_with_field_paths(tmp_path):
    with pytest.raises(ConfigError, match="sinks.tensorboard.log_dirr"):
        default_registry().make_sink({"name": "tensorboard", "log_dirr": str(tmp_path)})


def test_unknown_sink_names_get_a_suggestion():
    with pytest.raises(UnknownQuantityError, match="Did you mean 'tensorboard'"):
        default_registry().make_sink("tensorbord")


def test_register_sinks_hook_of_this_plugin(tmp_path):
    registry = Registry()
    registry.add_plugin(tb_plugin, name="tb")
    assert registry.sinks["tensorboard"].distribution == "<local>"
    sink = registry.make_sink({"name": "tensorboard", "log_dir": str(tmp_path), "flush_secs": 1})
    assert isinstance(sink, TensorBoardSink)
    sink.close()


def test_missing_tensorboard_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        TensorBoardSink(log_dir=str(tmp_path))


def test_metrics_become_scalars_and_other_kinds_are_ignored(tmp_path):
    sink = TensorBoardSink(log_dir=str(tmp_path))
    sink({"kind": "header", "params": []})
    sink({"kind": "metrics", "step": 3, "metrics": {"valid_accuracy": 0.75, "epoch_count": 1}})
    sink({"kind": "metrics", "step": 9, "metrics": {"valid_accuracy": 0.875}})
    sink({"kind": "quantity_added", "step": 4, "quantity": {"name": "grad_norm", "key": "gn"}})
    sink({"kind": "from_a_later_version", "step": 5})  # ignored
    sink.close()
    acc = _accumulate(tmp_path)
    valid = acc.Scalars("metrics/valid_accuracy")
    assert [(e.step, e.value) for e in valid] == [(3, 0.75), (9, 0.875)]
    assert [(e.step, e.value) for e in acc.Scalars("metrics/epoch_count")] == [(3, 1.0)]
    assert "cockpit/quantities_added/text_summary" in acc.Tags()["tensors"]
