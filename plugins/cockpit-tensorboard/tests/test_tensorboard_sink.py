"""The TensorBoard sink writes curated tags that TensorBoard's own reader reads back (issue 20).

TensorBoard stores scalars as float32 (``simple_value``), so read-back values are compared
with the float64 values at rtol 1e-6 (float32 rounding is at most 6e-8 relative).
"""

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("tensorboard")

from cockpit_tensorboard import TagMap, TensorBoardSink  # noqa: E402
from cockpit_tensorboard import plugin as tb_plugin  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

from cockpit_core import ConfigError, Registry, UnknownSinkError  # noqa: E402
from cockpit_core.plugin.registry import default_registry  # noqa: E402
from cockpit_core.testing import run_cockpit, tiny_mlp  # noqa: E402

F32 = 1e-6


def _accumulate(log_dir):
    guidance = {"scalars": 0, "histograms": 0, "images": 0, "tensors": 0}
    acc = EventAccumulator(str(log_dir), size_guidance=guidance)
    acc.Reload()
    return acc


def _series(acc, tag):
    events = acc.Scalars(tag)
    return [e.step for e in events], np.array([e.value for e in events])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three SGD steps of the tiny MLP with a real Cockpit and the tensorboard sink."""
    registry = default_registry()
    needed = {"alpha", "grad_hist_1d", "hess_trace", "hess_max_ev", "time"}
    if not needed <= set(registry.quantities):
        pytest.skip(f"needs the quantities {sorted(needed)}")
    log_dir = tmp_path_factory.mktemp("tb")
    quantities = [
        "loss",
        "grad_norm",
        "time",
        "alpha",
        {"name": "grad_hist_1d", "bins": 12},
        {"name": "hess_trace", "method": "hutchinson", "probes": 4},
        "hess_max_ev",
    ]
    result = run_cockpit(
        tiny_mlp(), quantities, steps=3, sinks=[{"name": "tensorboard", "log_dir": str(log_dir)}]
    )
    result.cockpit.close()
    return result, _accumulate(log_dir)


def test_exact_tags_of_a_training_run(run):
    result, acc = run
    names = result.cockpit.param_names
    per_param = [f"grad_norm/{n}" for n in names] + [f"hess_trace/{n}" for n in names]
    per_param += [f"hess_trace/std_error/{n}" for n in names]
    expected = {
        "loss",
        "time",
        "grad_norm/total",
        "alpha/alpha",
        "alpha/exact",
        "alpha/step_length",
        "grad_hist_1d/grad_abs_max",
        "grad_hist_1d/nonfinite/nan",
        "grad_hist_1d/nonfinite/posinf",
        "grad_hist_1d/nonfinite/neginf",
        "hess_trace/total",
        "hess_trace/std_error",
        "hess_trace/hvps",
        "hess_max_ev/value",
        "hess_max_ev/hvps",
        "hess_max_ev/converged",
        *per_param,
    }
    tags = acc.Tags()
    assert set(tags["scalars"]) == {f"cockpit/{t}" for t in expected}
    # histograms only for the 1-D gradient histogram: not alpha's fit, not eigenvalues
    assert set(tags["histograms"]) == {"cockpit/grad_hist_1d"} | {
        f"cockpit/grad_hist_1d/{n}" for n in names
    }
    assert tags["images"] == []  # image_every defaults to 0
    assert "cockpit/header/text_summary" in tags["tensors"]


def test_scalars_equal_the_brute_force_values_and_the_output(run):
    result, acc = run
    output = result.cockpit.get_output()
    steps, loss = _series(acc, "cockpit/loss")
    assert steps == [0, 1, 2]
    np.testing.assert_allclose(loss, [s.loss for s in result.snapshots], rtol=F32)
    for i, name in enumerate(result.cockpit.param_names):  # ||g_i||, float64 definition
        norms = [torch.linalg.vector_norm(s.grads[i]).item() for s in result.snapshots]
        np.testing.assert_allclose(_series(acc, f"cockpit/grad_norm/{name}")[1], norms, rtol=F32)
        traces = [output[s]["hess_trace"]["std_error_per_param"][i] for s in steps]
        tag = f"cockpit/hess_trace/std_error/{name}"
        np.testing.assert_allclose(_series(acc, tag)[1], traces, rtol=F32)
    total = [np.sqrt(sum(g.square().sum().item() for g in s.grads)) for s in result.snapshots]
    np.testing.assert_allclose(_series(acc, "cockpit/grad_norm/total")[1], total, rtol=F32)
    for tag, field in [("hess_trace/total", "total"), ("hess_trace/std_error", "std_error")]:
        expected = [output[s]["hess_trace"][field] for s in steps]
        np.testing.assert_allclose(_series(acc, f"cockpit/{tag}")[1], expected, rtol=F32)
    assert _series(acc, "cockpit/hess_trace/hvps")[1].tolist() == [4.0, 4.0, 4.0]
    eig = [output[s]["hess_max_ev"]["value"] for s in steps]
    np.testing.assert_allclose(_series(acc, "cockpit/hess_max_ev/value")[1], eig, rtol=F32)
    alpha_steps, alpha = _series(acc, "cockpit/alpha/alpha")
    assert alpha_steps == [0, 1]  # two-step: stored under the start step
    np.testing.assert_allclose(alpha, [output[s]["alpha"]["alpha"] for s in (0, 1)], rtol=F32)
    exact = _series(acc, "cockpit/alpha/exact")[1]
    assert exact.tolist() == [float(output[s]["alpha"]["exact"]) for s in (0, 1)]


def test_time_is_elapsed_seconds_not_a_float32_timestamp(run):
    result, acc = run
    output = result.cockpit.get_output()
    steps, elapsed = _series(acc, "cockpit/time")
    expected = [output[s]["time"] - output[0]["time"] for s in steps]  # float64 differences
    assert elapsed[0] == 0.0 and (np.diff(elapsed) > 0).all()
    np.testing.assert_allclose(elapsed, expected, rtol=F32, atol=1e-6)


def test_the_gradient_histogram_keeps_its_bins(run):
    result, acc = run
    output = result.cockpit.get_output()
    numel = sum(p.numel() for p in result.cockpit.params)
    batch = result.problem.batch_size
    for event in acc.Histograms("cockpit/grad_hist_1d"):
        hist = event.histogram_value
        value = output[event.step]["grad_hist_1d"]
        assert hist.num == batch * numel  # every per-sample gradient element once
        assert list(hist.bucket) == value["hist"].tolist()
        np.testing.assert_allclose(hist.bucket_limit, value["edges"][1:], rtol=1e-15)
        assert (hist.min, hist.max) == (value["edges"][0], value["edges"][-1])
    name = result.cockpit.param_names[2]
    last = acc.Histograms(f"cockpit/grad_hist_1d/{name}")[-1].histogram_value
    assert last.num == batch * result.cockpit.params[2].numel()


class UserWriter(SummaryWriter):
    """The training script's own writer; counts the calls of ``close``."""

    closes = 0

    def close(self):
        self.closes += 1
        super().close()


def test_the_users_writer_gets_the_tags_and_the_dashboard_and_stays_open(tmp_path):
    writer = UserWriter(log_dir=str(tmp_path))
    writer.add_scalar("train/accuracy", 0.5, 0)
    sink = TensorBoardSink(writer=writer, prefix="cp", image_every=2, image_dpi=20)
    result = run_cockpit(tiny_mlp(), ["loss"], steps=4, sinks=[sink])
    result.cockpit.close()
    assert writer.closes == 0
    acc = _accumulate(tmp_path)  # flushed by cp.close(), before the user closes the writer
    tags = acc.Tags()
    assert {"train/accuracy", "cp/loss"} <= set(tags["scalars"])
    images = acc.Images("cp/dashboard")
    assert [i.step for i in images] == [2, 3]  # 2 steps past step 0, then at the end
    assert all(i.width > 50 and i.height > 50 for i in images)
    np.testing.assert_allclose(
        _series(acc, "cp/loss")[1], [s.loss for s in result.snapshots], rtol=F32
    )
    writer.close()
    assert writer.closes == 1


def test_writer_options_are_checked(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    with pytest.raises(ValueError, match="log_dir or writer, not both"):
        TensorBoardSink(str(tmp_path), writer=writer)
    writer.close()
    with pytest.raises(TypeError, match="has no add_histogram_raw, add_image"):
        TensorBoardSink(writer=type("W", (), {"add_scalar": print, "add_text": print})())
    with pytest.raises(ValueError, match="image_every"):
        TensorBoardSink(str(tmp_path), image_every=-1)


def test_2d_histograms_arrays_and_strings_are_not_written(tmp_path):
    sink = TensorBoardSink(log_dir=str(tmp_path))
    sink({"kind": "header", "params": [{"name": "w"}, {"name": "total"}], "quantities": []})
    values = {
        "grad_hist_2d": {
            "hist": np.ones((3, 4), dtype=np.int64),
            "x_edges": np.arange(4.0),
            "y_edges": np.arange(5.0),
            "per_param": np.ones((2, 3, 4)),
            "grad_abs_max": 2.0,
        },
        "spectrum": {"value": 3.0, "eigenvalues": np.array([3.0, 1.0])},
        "parameters": [np.zeros(3), np.zeros(2)],
        "label": "text",
        "norm": {"total": 5.0, "per_param": np.array([3.0, 4.0])},  # param "total" collides
        "wrong_length": {"per_param": np.array([1.0, 2.0, 3.0])},
        "empty_hist": {"hist": np.zeros(2), "edges": np.array([0.0, 1.0, 2.0])},
        "nan_scalar": float("nan"),
        "huge": 10**400,  # beyond float64: +inf, not a failing sink
    }
    sink({"kind": "values", "step": 7, "values": values})
    sink({"kind": "error", "step": 7, "quantity": "x", "error": "ValueError: boom"})
    sink({"kind": "skipped", "step": 8, "quantities": ["loss"], "reason": "non-finite loss"})
    sink.close()
    acc = _accumulate(tmp_path)
    tags = acc.Tags()
    assert set(tags["scalars"]) == {
        "cockpit/grad_hist_2d/grad_abs_max",
        "cockpit/spectrum/value",
        "cockpit/norm/total",
        "cockpit/norm/w",
        "cockpit/norm/per_param/total",
        "cockpit/nan_scalar",
        "cockpit/huge",
    }
    assert tags["histograms"] == [] and tags["images"] == []
    assert [(e.step, e.value) for e in acc.Scalars("cockpit/norm/per_param/total")] == [(7, 4.0)]
    assert [(e.step, e.value) for e in acc.Scalars("cockpit/norm/total")] == [(7, 5.0)]
    assert np.isnan(acc.Scalars("cockpit/nan_scalar")[0].value)
    assert acc.Scalars("cockpit/huge")[0].value == np.inf
    assert {"cockpit/errors/text_summary", "cockpit/skipped/text_summary"} <= set(tags["tensors"])


def test_per_parameter_tags_are_bounded():
    tag_map = TagMap(prefix="", per_param_max=1)
    tag_map.header({"params": [{"name": "a"}, {"name": "b"}]})
    events = list(tag_map.values({"g": {"total": 1.0, "per_param": [0.5, 0.5]}}))
    assert [(e.tag, e.value) for e in events] == [("g/total", 1.0)]
    tag_map = TagMap(per_param=False)
    counts = {"hist": np.array([1, 2]), "edges": np.array([0.0, 1, 2]), "per_param": [[1, 2]]}
    assert [e.tag for e in tag_map.values({"h": counts})] == ["cockpit/h"]


def test_options_are_validated_with_field_paths(tmp_path):
    with pytest.raises(ConfigError, match="sinks.tensorboard.log_dirr"):
        default_registry().make_sink({"name": "tensorboard", "log_dirr": str(tmp_path)})
    with pytest.raises(ConfigError, match="sinks.tensorboard.image_every"):
        default_registry().make_sink({"name": "tensorboard", "image_every": -1})


def test_unknown_sink_names_get_a_suggestion():
    with pytest.raises(UnknownSinkError, match="Did you mean 'tensorboard'"):
        default_registry().make_sink("tensorbord")


def test_register_sinks_hook_of_this_plugin(tmp_path):
    registry = Registry()
    registry.add_plugin(tb_plugin, name="tb")
    assert registry.sinks["tensorboard"].distribution == "<local>"
    sink = registry.make_sink({"name": "tensorboard", "log_dir": str(tmp_path), "flush_secs": 1})
    assert isinstance(sink, TensorBoardSink) and sink.owns_writer
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
    sink({"kind": "quantity_added", "step": 4, "quantity": {"name": "time", "key": "clock"}})
    sink({"kind": "values", "step": 4, "values": {"clock": 1.8e9}})
    sink({"kind": "values", "step": 5, "values": {"clock": 1.8e9 + 0.25}})
    sink({"kind": "from_a_later_version", "step": 5})  # ignored
    sink.close()
    acc = _accumulate(tmp_path)
    valid = acc.Scalars("cockpit/metrics/valid_accuracy")
    assert [(e.step, e.value) for e in valid] == [(3, 0.75), (9, 0.875)]
    assert [(e.step, e.value) for e in acc.Scalars("cockpit/metrics/epoch_count")] == [(3, 1.0)]
    clock = [(e.step, e.value) for e in acc.Scalars("cockpit/clock")]
    assert clock == [(4, 0.0), (5, 0.25)]  # a time quantity added later: seconds elapsed
    assert "cockpit/quantities_added/text_summary" in acc.Tags()["tensors"]
