"""CockpitPlotter draws the native dashboard, names files as Cockpit 1.0.2, reads 1.0.2 logs."""

from __future__ import annotations

import json_tricks
import matplotlib
import numpy as np
import pytest
import torch
from cockpit_compat import Cockpit, CockpitPlotter, quantities
from cockpit_compat.plotter import read_legacy_log
from cockpit_compat.utils import schedules

from cockpit_core.errors import CockpitWarning
from cockpit_core.testing.problems import tiny_mlp

matplotlib.use("Agg")
EVERY = schedules.linear(1)


@pytest.fixture(scope="module")
def cockpit():
    problem = tiny_mlp(batch_size=6)
    model = problem.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(
        model.parameters(),
        [quantities.Loss(EVERY), quantities.GradNorm(EVERY), quantities.UpdateSize(EVERY)],
    )
    for step in range(3):
        x, y = problem.batch(step)
        opt.zero_grad()
        loss = problem.loss_module()(model(x), y)
        with cp(step, info={"loss": loss, "batch_size": 6, "optimizer": opt}):
            loss.backward()
        opt.step()
    return cp


@pytest.fixture
def no_show(monkeypatch):
    import matplotlib.pyplot as plt

    calls = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: calls.append(k))
    monkeypatch.setattr(plt, "pause", lambda *a, **k: None)
    return calls


def test_saving_names_files_like_1_0_2_and_never_shows(cockpit, tmp_path, no_show):
    plotter = CockpitPlotter()
    fig = plotter.plot(
        cockpit,
        show_plot=False,
        save_plot=True,
        savedir=tmp_path,
        savename="run",
        savename_append="7",
        savefig_kwargs={"format": "svg", "dpi": 40},
        plot_title="my run",
        discard=1,
    )
    assert no_show == []
    svg = (tmp_path / "run__primary__7.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "my run" in svg
    assert plotter.fig is fig and fig.get_dpi() == 40
    assert fig.texts[0].get_text() == "my run"


def test_show_plot_displays_the_figure_and_passes_block(cockpit, no_show):
    import matplotlib.pyplot as plt

    plotter = CockpitPlotter()
    plotter.plot(cockpit, show_plot=True, block=True, savefig_kwargs={"dpi": 30})
    assert no_show == [{"block": True}]
    window = plotter._window
    assert plt.fignum_exists(window.number) and window.axes[0].images
    plt.close(window)


def test_refusals(cockpit, tmp_path):
    with pytest.raises(ValueError, match="show_log_iter"):
        CockpitPlotter().plot(cockpit, show_plot=False, show_log_iter=True)
    with pytest.raises(ValueError, match="specify savedir"):
        CockpitPlotter().plot(cockpit, show_plot=False, save_plot=True)
    with pytest.raises(ValueError, match="Source must be"):
        CockpitPlotter().plot(42, show_plot=False)
    with pytest.raises(FileNotFoundError, match="Cockpit.write"):
        CockpitPlotter().plot(str(tmp_path / "missing"), show_plot=False)
    with pytest.warns(CockpitWarning, match="secondary"):
        CockpitPlotter(secondary_screen=True)


def test_debug_prints_the_panels_and_discard_drops_later_steps(cockpit, capsys):
    fig = CockpitPlotter().plot(
        cockpit, show_plot=False, debug=True, discard=1, savefig_kwargs={"dpi": 20}
    )
    printed = capsys.readouterr().out
    assert "[cockpit|plot] panels:" in printed and "Gradient norm" in printed
    assert "steps 0-1" in fig.texts[0].get_text()  # discard=1 left out step 2


def test_a_1_0_2_log_reads_back_into_the_native_layout(tmp_path):
    """A log as json-tricks writes it for Cockpit 1.0.2 (float32 arrays, Corder entries)."""
    edges = np.linspace(-1, 1, 5, dtype=np.float32)
    log = {
        "0": {
            "GradNorm": [3.0, 4.0],
            "GradNorm_2": [1.0],
            "HessTrace": [1.5, -0.5],
            "HessMaxEV": np.float64(2.5),
            "Alpha": -0.25,
            "NormTest": 0.75,
            "Loss": 1.25,
            "Parameters": [[[1.0, 2.0]], [0.5]],
            "GradHist1d": {"hist": np.ones(4, dtype=np.float32), "edges": edges},
            "GradHist2d": {
                "hist": np.ones((4, 2), dtype=np.int64),
                "edges": (edges, np.linspace(0, 1, 3, dtype=np.float32)),
                "param_groups": 2,
                "param_0": {"hist": np.ones((4, 2), dtype=np.int64), "edges": (edges, edges)},
                "param_1": {"hist": np.zeros((4, 2), dtype=np.int64), "edges": (edges, edges)},
            },
        },
        "3": {"epoch_count": 0, "train_loss": 0.5, "valid_accuracy": 0.75, "test_loss": None},
    }
    (tmp_path / "run.json").write_text(json_tricks.dumps(log, indent=4))
    data = read_legacy_log(tmp_path / "run.json")
    row = data.output[0]
    assert row["grad_norm"]["total"] == pytest.approx(5.0)
    np.testing.assert_array_equal(row["grad_norm"]["per_param"], [3.0, 4.0])
    assert row["grad_norm_2"]["total"] == 1.0
    assert row["hess_trace"]["total"] == pytest.approx(1.0)
    assert row["hess_max_ev"]["value"] == 2.5 and row["alpha"] == {"alpha": -0.25}
    assert row["norm_test"] == {"total": 0.75} and row["loss"] == 1.25
    assert [p.shape for p in row["parameters"]] == [(1, 2), (1,)]
    np.testing.assert_array_equal(row["grad_hist_1d"]["edges"], edges)
    assert row["grad_hist_2d"]["y_edges"].tolist() == [0.0, 0.5, 1.0]
    assert row["grad_hist_2d"]["per_param"].shape == (2, 4, 2)
    assert row["grad_hist_2d"]["per_param"][1].sum() == 0
    assert data.output[3] == {
        "metrics": {"epoch_count": 0, "train_loss": 0.5, "valid_accuracy": 0.75}
    }
    assert {"name": "grad_norm", "key": "grad_norm_2"} in data.header["quantities"]


def test_a_written_log_plots_from_its_logpath(cockpit, tmp_path, no_show):
    logpath = str(tmp_path / "logs" / "run")
    cockpit.write(logpath)
    data = read_legacy_log(logpath + ".json")
    native = cockpit.native.get_output()
    for step in native:
        np.testing.assert_allclose(
            data.output[step]["grad_norm"]["per_param"], native[step]["grad_norm"]["per_param"]
        )
        assert data.output[step]["grad_norm"]["total"] == pytest.approx(
            native[step]["grad_norm"]["total"], rel=1e-12
        )
    CockpitPlotter().plot(logpath, show_plot=False, save_plot=True, savefig_kwargs={"dpi": 30})
    assert (tmp_path / "logs" / "run" / "cockpit__primary.png").read_bytes()[:4] == b"\x89PNG"
    assert no_show == []
