"""`cockpit demo` trains on bundled data and leaves the log and the dashboard in a run folder."""

import pytest

from cockpit_core.cli.main import main
from cockpit_core.log import read_run

pytest.importorskip("sklearn")


def test_demo_writes_log_output_and_dashboard(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["demo", "--steps", "12", "--out", str(run), "--preset", "loss,grad_norm"]) == 0
    out = capsys.readouterr()
    assert f"Run folder: {run.resolve()}" in out.out.splitlines()[-1]
    assert "step 12/12" in out.err  # the progress bar
    assert (run / "dashboard.png").read_bytes().startswith(b"\x89PNG")
    data = read_run(run / "log.jsonl")
    tracked = [s for s, values in data.output.items() if set(values) - {"metrics"}]
    assert tracked == list(range(12))
    assert sorted(data.metrics) == [0, 12]  # the first epoch's start, after the last step
    assert read_run(run / "output.json").output.keys() == data.output.keys()


def test_demo_logs_epoch_metrics_that_the_performance_panel_draws(tmp_path, capsys):
    from cockpit_dashboard import plan
    from cockpit_demo.training import load_digits_tensors, split_train_valid

    from cockpit_core.log import read_records

    run = tmp_path / "run"
    assert main(["demo", "--steps", "30", "--out", str(run), "--preset", "loss"]) == 0
    assert "accuracy: train" in capsys.readouterr().out
    (x_train, _), (x_valid, _) = split_train_valid(*load_digits_tensors())
    assert (len(x_train), len(x_valid)) == (1437, 360)  # every fifth image validates
    # an epoch is 1437 // 64 = 22 steps: epochs start at steps 0 and 22; 30 is the end
    records = [r for r in read_records(run / "log.jsonl") if r["kind"] == "metrics"]
    assert [r["step"] for r in records] == [0, 22, 30]
    assert [r["metrics"].get("epoch_count") for r in records] == [0, 1, None]
    names = {"train_loss", "valid_loss", "train_accuracy", "valid_accuracy"}
    assert all(names <= set(r["metrics"]) for r in records)
    first, last = records[0]["metrics"], records[-1]["metrics"]
    assert abs(first["train_loss"] - 2.30) < 0.1  # an untrained 10-class net: about ln 10
    assert last["valid_accuracy"] > 0.7 > first["valid_accuracy"]
    data = read_run(run / "log.jsonl")
    assert (
        data.metrics
        == read_run(run / "output.json").metrics
        == {r["step"]: r["metrics"] for r in records}
    )
    titles = [p.title for p in plan(data).panels]
    assert "Performance" in titles
