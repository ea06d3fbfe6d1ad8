"""`cockpit demo` trains on bundled data and leaves the log and the dashboard in a run folder."""

import pytest

from cockpit_core.cli import main
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
    assert sorted(data.output) == list(range(12))
    assert read_run(run / "output.json").output.keys() == data.output.keys()
