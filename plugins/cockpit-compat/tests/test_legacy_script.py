"""A Cockpit 1.0.2 training script, with only its imports changed, runs on the native engine.

The script tracks all 19 quantities every step, asks for a BackPACK extension on top, logs
each epoch, adds quantities mid-run, writes its log and plots the dashboard twice (from the
Cockpit and from the log). Its
output must hold exactly the native Cockpit's values of the same run, in Cockpit 1.0.2's
layout, and agree with brute-force float64 references for the loss, the gradient norm,
the norm test, the distance and the update size.
"""

from __future__ import annotations

import math
import time

import json_tricks
import numpy as np
import pytest
import torch

from cockpit_core import Cockpit as NativeCockpit
from cockpit_core.testing.reference import per_sample_gradients_from_losses

pytestmark = pytest.mark.filterwarnings(
    "ignore:Using backward\\(\\) with create_graph=True:UserWarning"
)

EPOCHS, STEPS_PER_EPOCH, BATCH, LR = 2, 2, 8, 0.1
STEPS = EPOCHS * STEPS_PER_EPOCH
INITIAL = [  # the quantities given to the constructor; TICTrace and Time are added later
    "Alpha",
    "CABS",
    "Distance",
    "EarlyStopping",
    "GradHist1d",
    "GradHist2d",
    "GradNorm",
    "HessMaxEV",
    "HessTrace",
    "InnerTest",
    "Loss",
    "MeanGSNR",
    "NormTest",
    "OrthoTest",
    "Parameters",
    "TICDiag",
    "UpdateSize",
]
ADDED = ["TICTrace", "Time"]
NATIVE_NAME = {
    "Alpha": "alpha",
    "CABS": "cabs",
    "Distance": "distance",
    "EarlyStopping": "early_stopping",
    "GradHist1d": "grad_hist_1d",
    "GradHist2d": "grad_hist_2d",
    "GradNorm": "grad_norm",
    "HessMaxEV": "hess_max_ev",
    "HessTrace": "hess_trace",
    "InnerTest": "inner_test",
    "Loss": "loss",
    "MeanGSNR": "mean_gsnr",
    "NormTest": "norm_test",
    "OrthoTest": "ortho_test",
    "Parameters": "parameters",
    "TICDiag": "tic_diag",
    "TICTrace": "tic_trace",
    "Time": "time",
    "UpdateSize": "update_size",
}


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 5),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 4),
        torch.nn.ReLU(),
        torch.nn.Linear(4, 3),
    ).double()


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * BATCH, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (STEPS * BATCH,), generator=gen)
    return x, y


def batches(epoch: int):
    x, y = data()
    for i in range(STEPS_PER_EPOCH):
        s = epoch * STEPS_PER_EPOCH + i
        yield x[s * BATCH : (s + 1) * BATCH], y[s * BATCH : (s + 1) * BATCH]


def epoch_metrics(epoch: int) -> tuple[float, ...]:
    """Made-up evaluation results of an epoch (train/valid/test loss and accuracy)."""
    return 1.0 / (epoch + 1), 1.1 / (epoch + 1), 1.2 / (epoch + 1), 0.5, 0.4, 0.3


def legacy_script(logpath: str, savedir: str):
    """Cockpit 1.0.2's example loop: only the imports differ (cockpit -> cockpit_compat)."""
    from backpack import extend, extensions
    from cockpit_compat import Cockpit, CockpitPlotter, quantities
    from cockpit_compat.utils import schedules

    model = extend(make_model())
    loss_fn = extend(torch.nn.CrossEntropyLoss(reduction="mean"))
    individual_loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    every_step = schedules.linear(interval=1)
    tracked = [getattr(quantities, name)(every_step) for name in INITIAL]
    cockpit = Cockpit(model.parameters(), quantities=tracked)
    plotter = CockpitPlotter()

    global_step = 0
    for epoch in range(EPOCHS):
        for inputs, labels in batches(epoch):
            opt.zero_grad()
            outputs = model(inputs)
            loss = loss_fn(outputs, labels)
            losses = individual_loss_fn(outputs, labels)
            with cockpit(
                global_step,
                extensions.DiagHessian(),  # computed on top, left on the parameters
                info={
                    "batch_size": inputs.shape[0],
                    "individual_losses": losses,
                    "loss": loss,
                    "optimizer": opt,
                },
            ):
                loss.backward(create_graph=cockpit.create_graph(global_step))
            opt.step()
            global_step += 1
        lr = opt.param_groups[0]["lr"]
        cockpit.log(global_step - 1, epoch, *epoch_metrics(epoch), lr)
        if epoch == 0:
            cockpit.add(quantities.TICTrace(every_step))
            cockpit.add(quantities.Time(every_step))

    cockpit.write(logpath)
    plotter.plot(cockpit, savedir=savedir, show_plot=False, save_plot=True)
    plotter.plot(logpath, savedir=savedir, show_plot=False, save_plot=True, savename_append="log")
    return cockpit, model


def native_run():
    """The same run with the native API."""
    from cockpit_backpack import extend

    model = extend(make_model())
    loss_fn = extend(torch.nn.CrossEntropyLoss(reduction="mean"))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    names = [NATIVE_NAME[n] for n in INITIAL]
    names[names.index("hess_max_ev")] = {"name": "hess_max_ev", "which": "largest_magnitude"}
    cp = NativeCockpit(model.parameters(), quantities=names)
    step = 0
    for epoch in range(EPOCHS):
        for inputs, labels in batches(epoch):
            opt.zero_grad()
            outputs = model(inputs)
            loss = loss_fn(outputs, labels)
            losses = torch.nn.functional.cross_entropy(outputs, labels, reduction="none")
            info = {"batch_size": len(inputs), "individual_losses": losses, "loss": loss}
            with cp(step, info={**info, "optimizer": opt}):
                loss.backward(retain_graph=cp.retain_graph(step))
            opt.step()
            step += 1
        names = ("train_loss", "valid_loss", "test_loss")
        accs = ("train_accuracy", "valid_accuracy", "test_accuracy")
        values = dict(zip(names + accs, epoch_metrics(epoch)))
        cp.log(step - 1, epoch_count=epoch, learning_rate=LR, **values)
        if epoch == 0:
            cp.add("tic_trace")
            cp.add("time")
    return cp.get_output()


def reference_trajectory():
    """Parameters, loss, gradient and per-sample gradients at every step (plain autograd)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    params = list(model.parameters())
    steps = []
    for epoch in range(EPOCHS):
        for inputs, labels in batches(epoch):
            losses = torch.nn.functional.cross_entropy(model(inputs), labels, reduction="none")
            per_sample = per_sample_gradients_from_losses(losses, params)
            opt.zero_grad()
            losses.mean().backward()
            steps.append(
                {
                    "theta": [p.detach().clone() for p in params],
                    "loss": float(losses.mean().detach()),
                    "grad": [p.grad.detach().clone() for p in params],
                    "per_sample": per_sample,
                }
            )
            opt.step()
    final = [p.detach().clone() for p in params]
    return steps, final


def legacy_value(name: str, native: dict):
    """Cockpit 1.0.2's value of quantity ``name`` from the native value."""
    if name in ("Loss", "Time"):
        return native
    if name == "Parameters":
        return [np.asarray(p).tolist() for p in native]
    if name in ("GradNorm", "Distance", "UpdateSize", "HessTrace"):
        return [float(v) for v in native["per_param"]]
    if name == "Alpha":
        return native["alpha"]
    if name == "HessMaxEV":
        return native["value"]
    if name == "GradHist1d":
        return {"hist": native["hist"], "edges": native["edges"]}
    if name == "GradHist2d":
        return {"hist": native["hist"], "edges": (native["x_edges"], native["y_edges"])}
    return native["total"]


def assert_same(actual, expected, where: str):
    if isinstance(expected, dict):
        assert set(actual) == set(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, (tuple, list)) and expected and not np.isscalar(expected[0]):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected), err_msg=where)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    tmp = tmp_path_factory.mktemp("legacy")
    shows = []
    real_show = plt.show
    plt.show = lambda *a, **k: shows.append((a, k))
    try:
        began = time.time()
        cockpit, model = legacy_script(str(tmp / "logs" / "run"), str(tmp / "plots"))
        ended = time.time()
    finally:
        plt.show = real_show
    return {
        "cockpit": cockpit,
        "model": model,
        "output": cockpit.get_output(),
        "tmp": tmp,
        "shows": shows,
        "window": (began, ended),
    }


def test_the_script_tracks_every_quantity_in_the_1_0_2_layout(run):
    out = run["output"]
    assert sorted(out) == list(range(STEPS))
    metrics = {"epoch_count", "train_loss", "valid_loss", "test_loss"}
    metrics |= {"train_accuracy", "valid_accuracy", "test_accuracy", "learning_rate"}
    two_step = {"Alpha", "UpdateSize"}
    for step, row in out.items():
        expected = set(INITIAL) - (two_step if step == STEPS - 1 else set())
        expected |= set(ADDED) if step >= STEPS_PER_EPOCH else set()
        expected |= metrics if step % STEPS_PER_EPOCH == STEPS_PER_EPOCH - 1 else set()
        assert set(row) == expected, step
    row = out[0]
    assert isinstance(row["Loss"], float) and isinstance(row["Alpha"], float)
    for name in ("GradNorm", "Distance", "UpdateSize", "HessTrace"):
        assert len(row[name]) == 6 and all(isinstance(v, float) for v in row[name])
    assert [np.shape(p) for p in row["Parameters"]] == [(5, 6), (5,), (4, 5), (4,), (3, 4), (3,)]
    assert isinstance(row["Parameters"][0], list)
    assert row["GradHist1d"]["hist"].shape == (100,) and row["GradHist1d"]["edges"].shape == (101,)
    assert row["GradHist1d"]["hist"].sum() == BATCH * 74  # every per-sample gradient element
    assert row["GradHist2d"]["hist"].shape == (40, 50)
    assert [e.shape for e in row["GradHist2d"]["edges"]] == [(41,), (51,)]
    assert out[1]["epoch_count"] == 0 and out[3]["epoch_count"] == 1
    assert out[3]["train_loss"] == pytest.approx(0.5) and out[3]["learning_rate"] == LR
    began, ended = run["window"]
    assert began <= out[2]["Time"] <= out[3]["Time"] <= ended
    assert run["shows"] == []  # show_plot=False never calls plt.show


def test_the_values_are_the_native_cockpits(run):
    native = native_run()
    out = run["output"]
    for step, row in out.items():
        for name in NATIVE_NAME:
            if name not in row or name == "Time":
                continue
            assert_same(row[name], legacy_value(name, native[step][NATIVE_NAME[name]]), name)


def test_the_values_match_brute_force_references(run):
    steps, final = reference_trajectory()
    out = run["output"]
    for p, ref in zip(run["model"].parameters(), final):  # tracking did not change training
        torch.testing.assert_close(p.detach(), ref, rtol=0, atol=1e-14)
    for s, ref in enumerate(steps):
        row = out[s]
        assert row["Loss"] == pytest.approx(ref["loss"], rel=1e-12)
        grad_norms = [float(g.norm()) for g in ref["grad"]]
        np.testing.assert_allclose(row["GradNorm"], grad_norms, rtol=1e-10)
        g = torch.cat([t.flatten() for t in ref["grad"]])
        gn = torch.cat([t.flatten(1) for t in ref["per_sample"]], dim=1)
        theta = math.sqrt(float(((gn - g) ** 2).sum()) / (BATCH * (BATCH - 1) * float(g @ g)))
        assert row["NormTest"] == pytest.approx(theta, rel=1e-9)
        distance = [float((p - p0).norm()) for p, p0 in zip(ref["theta"], steps[0]["theta"])]
        np.testing.assert_allclose(row["Distance"], distance, rtol=1e-10, atol=1e-15)
        after = steps[s + 1]["theta"] if s + 1 < len(steps) else final
        if s < STEPS - 1:
            update = [float((q - p).norm()) for p, q in zip(ref["theta"], after)]
            np.testing.assert_allclose(row["UpdateSize"], update, rtol=1e-10)
        np.testing.assert_array_equal(row["Parameters"][0], ref["theta"][0].numpy())


def test_the_custom_extension_is_left_on_the_parameters(run):
    """``p.diag_h`` of the last step sums to that step's HessTrace (the same DiagHessian)."""
    traces = [float(p.diag_h.detach().sum()) for p in run["model"].parameters()]
    np.testing.assert_allclose(traces, run["output"][STEPS - 1]["HessTrace"], rtol=1e-12)


def test_write_gives_a_json_that_json_tricks_reads_like_cockpit_1_0_2(run):
    path = run["tmp"] / "logs" / "run.json"
    assert path.is_file()
    loaded = json_tricks.loads(path.read_text())  # how Cockpit 1.0.2's plotter reads logs
    out = run["output"]
    assert sorted(loaded) == [str(s) for s in sorted(out)]
    for step, row in out.items():
        assert set(loaded[str(step)]) == set(row)
        for name, value in row.items():
            assert_same(loaded[str(step)][name], value, f"{step}.{name}")


def test_the_dashboard_is_saved_from_the_cockpit_and_from_the_log(run):
    plots = run["tmp"] / "plots"
    for name in ("cockpit__primary.png", "cockpit__primary__log.png"):
        picture = (plots / name).read_bytes()
        assert picture[:8] == b"\x89PNG\r\n\x1a\n" and len(picture) > 50_000
