"""Run comparison: several runs in one dashboard, a colour and a legend entry per run (issue 20)."""

import warnings

import numpy as np
import pytest
from cockpit_dashboard import render
from cockpit_dashboard.compare import RUN_COLORS, run_labels
from matplotlib.colors import to_hex

from cockpit_core.cli.main import main
from cockpit_core.log import LogData, read_run
from cockpit_core.panel import Instrument, series
from cockpit_core.panel.data import smooth_window
from cockpit_core.testing import run_cockpit, tiny_mlp

LOSSES = {
    "lr 0.01": [2.3, 2.2, 2.1, 2.0, 1.9],
    "lr 0.1": [2.3, 1.5, 0.9, 0.6, 0.4],
    "lr 1": [2.3, 4.0, 3.1, 5.2, 4.4],
}


def _run(loss, lr=None, metric_lr=None, extra=None):
    """A synthetic run: ``loss`` per step, the learning rate as a quantity or a metric."""
    output = {}
    for step, value in enumerate(loss):
        output[step] = {"loss": value, **(extra or {})}
        if lr is not None:
            output[step]["optimizer_hparams"] = {"optimizer": "SGD", "groups": [{"lr": lr}]}
        if metric_lr is not None and step == 0:
            output[step]["metrics"] = {"learning_rate": metric_lr}
    return LogData({}, output)


def _panel(fig, title):
    return next(ax for ax in fig.axes if ax.get_title(loc="left") == title)


def _legend_labels(ax):
    legends = [a.get_legend() for a in [ax, *ax.figure.axes] if a.get_legend() is not None]
    legend = next(lg for lg in legends if lg.axes is ax or lg.axes.bbox.bounds == ax.bbox.bounds)
    return [t.get_text() for t in legend.get_texts()]


def _centred_mean(x, window):
    """The mean of the ``window`` points around each point (fewer at the ends), by a loop."""
    half = window // 2
    return np.asarray(
        [np.mean(x[max(0, i - half) : i + half + 1]) for i in range(len(x))], dtype=np.float64
    )


def test_overlay_draws_each_run_in_its_colour_with_one_legend_entry(registry_with_basic):
    runs = [_run(loss, lr=float(label[3:])) for label, loss in LOSSES.items()]
    fig = render(runs, instruments=[registry_with_basic.instruments["loss"]])
    ax = _panel(fig, "Mini-batch loss")
    assert _legend_labels(ax) == list(LOSSES)  # learning rates from optimizer_hparams
    for k, loss in enumerate(LOSSES.values()):
        mine = [line for line in ax.lines if to_hex(line.get_color()) == RUN_COLORS[k]]
        raw, smooth = mine  # the grey per-step line became faint, the moving average solid
        np.testing.assert_allclose(raw.get_ydata(), loss, rtol=0, atol=0)
        np.testing.assert_allclose(raw.get_xdata(), np.arange(5))
        assert raw.get_alpha() <= 0.3 and smooth.get_alpha() in (None, 1.0)
        # the instrument's own moving average, recomputed here by the definition
        window = smooth_window(len(loss))
        np.testing.assert_allclose(smooth.get_ydata(), _centred_mean(loss, window), rtol=1e-12)


def draw_with_reference(ax, output, header):
    steps, values = series(output, "loss", None)
    ax.axhline(1.0, color="#9a9aa8", ls="--")  # the same in every run: kept once
    ax.plot(steps, values, color="#3b6fb6", label="loss")
    twin = ax.twinx()
    twin.plot(steps, 10 * values, color="#ee7d2b")
    ax.text(0.5, 0.9, f"last {values[-1]:.1f}", transform=ax.transAxes)
    ax.legend()


REFERENCE = Instrument(
    "loss_ref", "Loss with reference", "performance", ("loss",), draw_with_reference
)


def test_shared_reference_lines_twin_axes_and_texts():
    runs = [_run(loss) for loss in LOSSES.values()]
    fig = render(runs, instruments=[REFERENCE], labels=["a", "b", "c"])
    ax = _panel(fig, "Loss with reference")
    reference = [line for line in ax.lines if list(line.get_ydata()) == [1.0, 1.0]]
    assert len(reference) == 1 and to_hex(reference[0].get_color()) == "#9a9aa8"
    twins = [a for a in fig.axes if a is not ax and a.get_shared_x_axes().joined(a, ax)]
    assert len(twins) == 3  # one per run's draw call, on one common range
    highest = max(10 * max(loss) for loss in LOSSES.values())
    lowest = min(10 * min(loss) for loss in LOSSES.values())
    for twin in twins:
        low, high = twin.get_ylim()
        assert low <= lowest and high >= highest
        assert twin.get_ylim() == twins[0].get_ylim()
    assert [t.axison for t in twins] == [True, False, False]
    texts = {t.get_text(): to_hex(t.get_color()) for t in ax.texts}
    assert texts == {
        "last 1.9": RUN_COLORS[0],
        "last 0.4": RUN_COLORS[1],
        "last 4.4": RUN_COLORS[2],
    }
    assert _legend_labels(ax) == ["a", "b", "c"]


def draw_heat_map(ax, output, header):
    steps, values = series(output, "loss", None)
    ax.pcolormesh(np.vstack([values, values]))


@pytest.mark.parametrize(
    "instrument",
    [
        Instrument("heat", "Heat map", "gradient", ("loss",), draw_heat_map),  # decided
        Instrument("lines", "Lines", "gradient", ("loss",), draw_with_reference, overlay=False),
    ],
)
def test_panels_that_cannot_share_axes_are_drawn_side_by_side(instrument):
    runs = [_run(loss) for loss in list(LOSSES.values())[:2]]
    fig = render(runs, instruments=[instrument], labels=["small", "large"])
    host = _panel(fig, instrument.title)
    assert not host.axison and not host.lines and not host.collections
    subs = host.child_axes
    assert [s.get_title() for s in subs] == ["small", "large"]
    assert [to_hex(s.title.get_color()) for s in subs] == list(RUN_COLORS[:2])
    for sub, loss in zip(subs, list(LOSSES.values())[:2]):
        drawn = sub.collections[0].get_array() if sub.collections else sub.lines[1].get_ydata()
        np.testing.assert_allclose(np.ravel(drawn)[-5:], loss)


def test_union_of_panels_and_a_failing_run(registry_with_basic):
    insts = registry_with_basic.instruments
    with_norm = _run(LOSSES["lr 0.1"], extra={"grad_norm": 1.0})

    def fragile(ax, output, header):
        if series(output, "loss", None)[1][-1] > 3:
            raise RuntimeError("boom")
        ax.plot(*series(output, "loss", None))

    broken = Instrument("fragile", "Fragile", "performance", ("loss",), fragile)
    with pytest.warns(UserWarning, match="'fragile' failed for run 'lr 1'"):
        fig = render(
            [_run(LOSSES["lr 0.01"], lr=0.01), with_norm, _run(LOSSES["lr 1"], metric_lr=1.0)],
            instruments=[insts["loss"], insts["grad_norm"], broken],
        )
    norm = _panel(fig, "Gradient norm")  # only the second run tracked it: still shown
    assert _legend_labels(norm) == ["run 2"]  # no learning rate logged, no path
    assert _legend_labels(_panel(fig, "Fragile")) == ["lr 0.01", "run 2", "lr 1 (could not draw)"]
    assert len(_panel(fig, "Fragile").lines) == 2


def test_labels_from_headers_paths_and_repeats(tmp_path):
    datas = [_run([1.0], lr=0.1), _run([1.0], metric_lr=0.03), _run([1.0]), _run([1.0], lr=0.1)]
    sources = [tmp_path / name / "log.jsonl" for name in "abcd"]
    assert run_labels(datas, sources) == [
        "lr 0.1 (a/log.jsonl)",  # repeated: the path tells them apart
        "lr 0.03",  # from the learning_rate metric of cp.log
        "c/log.jsonl",  # nothing logged: the shortest distinct path tail
        "lr 0.1 (d/log.jsonl)",
    ]
    assert run_labels(datas[:2], [object(), object()]) == ["lr 0.1", "lr 0.03"]
    assert run_labels([_run([1.0]), _run([1.0])], [{}, {}]) == ["run 1", "run 2"]
    with pytest.raises(ValueError, match="2 labels for 1 runs"):
        run_labels(datas[:1], sources[:1], ["x", "y"])


def test_cli_plot_compares_logs(tmp_path, capsys):
    logs = []
    for name in ("small", "large"):
        log = tmp_path / name / "log.jsonl"
        result = run_cockpit(tiny_mlp(), ["loss", "grad_norm"], steps=3, log=log)
        result.cockpit.close()
        logs.append(str(log))
    out = tmp_path / "cmp.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["plot", *logs, "-o", str(out), "--labels", "small,large"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    assert f"Comparison written to {out}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["plot", *logs, "-o", str(out), "--labels", "only-one"])
    assert exit_.value.code == 2


def test_demo_compare_lr_writes_the_logs_and_the_comparison(tmp_path, capsys):
    pytest.importorskip("sklearn")
    out = tmp_path / "cmp"
    argv = ["demo", "--compare-lr", "0.01,1", "--steps", "3", "--preset", "loss", "--out"]
    assert main([*argv, str(out)]) == 0
    assert (out / "compare_lr.png").read_bytes().startswith(b"\x89PNG")
    assert "Comparison of 2 learning rates" in capsys.readouterr().out
    logs = [out / "lr-0.01" / "log.jsonl", out / "lr-1" / "log.jsonl"]
    datas = [read_run(log) for log in logs]
    assert [sorted(d.output) for d in datas] == [[0, 1, 2, 3]] * 2
    assert [d.metrics[0]["learning_rate"] for d in datas] == [0.01, 1.0]
    # the same start: identical first loss; then the learning rates differ
    first = [d.output[0]["loss"] for d in datas]
    assert first[0] == first[1] and datas[0].output[2]["loss"] != datas[1].output[2]["loss"]
    assert run_labels(datas, logs) == ["lr 0.01", "lr 1"]
    with pytest.raises(SystemExit):
        main([*argv[:2], "0.1,-1", *argv[3:], str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()


def test_overlay_field_is_checked_and_a_list_of_one_is_a_plain_dashboard(registry_with_basic):
    with pytest.raises(TypeError, match="overlay must be None, True or False"):
        Instrument("x", "t", "gradient", ("loss",), draw_heat_map, overlay="yes")
    assert Instrument("x", "t", "gradient", ("loss",), draw_heat_map).overlay is None
    fig = render(
        [_run(LOSSES["lr 1"], lr=1.0)], instruments=[registry_with_basic.instruments["loss"]]
    )
    ax = _panel(fig, "Mini-batch loss")
    assert _legend_labels(ax) == ["mini-batch loss", "moving average"]  # the instrument's own
    with pytest.raises(ValueError, match="at least one run"):
        render([])
