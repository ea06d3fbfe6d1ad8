"""The Performance panel draws the metrics of ``cp.log`` (train/valid/test loss and accuracy)."""

import numpy as np
import torch
from cockpit_dashboard import LivePlot, plan, render
from matplotlib.figure import Figure

from cockpit_core import Cockpit
from cockpit_core.log import LogData
from cockpit_core.panel import metric_series

from ._helpers import figure_texts, panel_titles

METRICS = {
    0: {"epoch_count": 0, "train_loss": 2.3, "valid_loss": 2.31, "train_accuracy": 0.1},
    20: {"epoch_count": 1, "train_loss": 0.5, "valid_loss": 0.6, "train_accuracy": 0.8},
    40: {"epoch_count": 2, "train_loss": 0.2, "valid_loss": 0.4, "train_accuracy": 0.9},
}


def _output(metrics, losses=range(41)):
    output = {s: {"loss": 2.0 / (1 + s)} for s in losses}
    for step, values in metrics.items():
        output.setdefault(step, {})["metrics"] = dict(values)
    return output


def _header():
    return {"quantities": [{"name": "loss", "key": "loss"}]}


def _panel(fig, title="Performance"):
    return next(a for a in fig.axes if a.get_title(loc="left") == title)


def test_the_panel_is_registered_by_cockpit_basic(registry_with_basic):
    inst = registry_with_basic.instruments["performance"]
    assert (inst.title, inst.topic, inst.quantities) == ("Performance", "performance", ("metrics",))


def test_losses_left_accuracies_right_with_the_latest_values_in_the_legend(registry_with_basic):
    metrics = {s: {**m, "valid_accuracy": m["train_accuracy"] - 0.05} for s, m in METRICS.items()}
    fig = render(LogData(_header(), _output(metrics)), registry=registry_with_basic)
    assert panel_titles(fig) == ["Mini-batch loss", "Performance"]
    ax = _panel(fig)
    assert [line.get_label() for line in ax.lines] == ["train loss 0.2", "valid loss 0.4"]
    for line, name in zip(ax.lines, ["train_loss", "valid_loss"]):
        steps, values = line.get_data()
        assert list(steps) == [0, 20, 40]
        np.testing.assert_allclose(values, [METRICS[s][name] for s in (0, 20, 40)])
    assert ax.lines[1].get_linestyle() == "--"  # valid: dashed
    twin = next(a for a in fig.axes if a is not ax and a.bbox.bounds == ax.bbox.bounds)
    assert twin.get_ylabel() == "accuracy" and ax.get_ylabel() == "loss"
    assert [line.get_label() for line in twin.lines] == ["train acc 0.9", "valid acc 0.85"]
    np.testing.assert_allclose(twin.lines[1].get_ydata(), [0.05, 0.75, 0.85])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["train loss 0.2", "valid loss 0.4", "train acc 0.9", "valid acc 0.85"]
    # the epochs on a top axis, at the steps where epoch_count was logged
    top = next(c for c in ax.child_axes if c.get_xlabel() == "epoch")
    assert list(top.get_xticks()) == [0, 20, 40]
    assert [t.get_text() for t in top.get_xticklabels()] == ["0", "1", "2"]


def test_only_accuracies_use_the_panel_axis_itself():
    inst = _basic_instrument()
    output = {3: {"metrics": {"test_accuracy": 0.5}}, 9: {"metrics": {"test_accuracy": 0.75}}}
    fig = Figure()
    ax = fig.add_subplot()
    inst.draw(ax, output, {})
    assert len(fig.axes) == 1 and ax.get_ylabel() == "accuracy"
    assert ax.lines[0].get_label() == "test acc 0.75" and ax.lines[0].get_linestyle() == ":"
    assert ax.child_axes == []  # no epoch_count logged: no epoch axis


def _basic_instrument():
    from cockpit_basic.instruments import INSTRUMENTS

    return next(i for i in INSTRUMENTS if i.name == "performance")


def test_available_only_with_losses_or_accuracies():
    inst = _basic_instrument()
    assert inst.available({5: {"metrics": {"valid_loss": 1.0}}})
    assert not inst.available({5: {"metrics": {"learning_rate": 0.1, "epoch_count": 1}}})
    assert not inst.available({5: {"metrics": {"valid_loss": None}}})


def test_without_metrics_the_panel_is_not_shown_and_the_note_says_how(registry_with_basic):
    data = LogData(_header(), _output({}))
    fig = render(data, registry=registry_with_basic)
    assert "Performance" not in panel_titles(fig)
    note = " ".join(figure_texts(fig))
    assert (
        "No metrics logged, so not shown: Performance. Log them with cp.log(step, "
        "train_loss=..., valid_accuracy=...)." in note
    )
    assert "(metrics)" not in note  # not among the quantities to add


def test_metrics_the_panel_does_not_draw_leave_it_out_for_lack_of_data(registry_with_basic):
    data = LogData(_header(), _output({4: {"learning_rate": 0.1}}))
    p = plan(data, registry_with_basic.instruments.values())
    assert [i.name for i in p.unavailable] == ["performance"]
    assert "metrics" not in p.without_panel


def test_a_cockpit_with_logged_metrics_plots_the_panel():
    from cockpit_core.testing import run_cockpit, tiny_mlp

    result = run_cockpit(tiny_mlp(), ["loss"], steps=3)
    cp = result.cockpit
    cp.log(0, train_accuracy=torch.tensor(0.25), valid_accuracy=0.2, epoch_count=0)
    cp.log(2, train_accuracy=0.5, valid_accuracy=0.4, epoch_count=1)
    fig = cp.plot()
    ax = _panel(fig)
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [0.2, 0.4])


def test_live_plot_keeps_metrics_and_added_quantities(tmp_path):
    live = LivePlot(tmp_path / "live.png", every=100)
    live({"kind": "header", "quantities": [{"name": "loss", "key": "loss"}]})
    live({"kind": "values", "step": 0, "values": {"loss": 1.0}})  # first picture
    live({"kind": "quantity_added", "step": 1, "quantity": {"name": "grad_norm", "key": "gn"}})
    live({"kind": "values", "step": 1, "values": {"loss": 0.5, "gn": {"total": 2.0}}})
    live({"kind": "metrics", "step": 1, "metrics": {"valid_loss": 0.7}})
    live({"kind": "metrics", "step": 1, "metrics": {"valid_accuracy": 0.6}})
    assert live.renders == 1
    live.close()  # the metrics and the step arrived since: one more picture
    assert live.renders == 2
    assert live.data.metrics == {1: {"valid_loss": 0.7, "valid_accuracy": 0.6}}
    assert live.data.header["quantities"][-1] == {"name": "grad_norm", "key": "gn", "added_at": 1}
    titles = [p.title for p in plan(live.data).panels]
    assert "Performance" in titles and "Gradient norm [gn]" in titles


def test_metric_series_reads_one_metric():
    output = {1: {"metrics": {"a": 1, "b": 2}}, 2: {"loss": 3.0}, 4: {"metrics": {"a": None}}}
    steps, values = metric_series(output, "a")
    assert list(steps) == [1] and list(values) == [1.0]


def test_metrics_reach_the_panel_through_a_jsonl_log(tmp_path, registry_with_basic):
    from cockpit_core.testing import tiny_mlp

    model = tiny_mlp().make_model()
    cp = Cockpit(model, ["loss"], log=tmp_path / "log.jsonl", registry=registry_with_basic)
    for step in range(3):
        cp.log(step, train_loss=1.0 / (step + 1), epoch_count=step)
    cp.close()
    fig = render(tmp_path / "log.jsonl", registry=registry_with_basic)
    np.testing.assert_allclose(_panel(fig).lines[0].get_ydata(), [1.0, 0.5, 1 / 3])
