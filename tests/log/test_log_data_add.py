"""Folding a running Cockpit's records one by one (``LogData.add``) equals reading its log."""

from cockpit_core.log import LogData, read_run
from cockpit_core.testing import run_cockpit, tiny_mlp


def test_records_folded_one_by_one_equal_the_log_read_back(tmp_path):
    seen = []
    log = tmp_path / "log.jsonl"
    result = run_cockpit(
        tiny_mlp(),
        ["loss", "grad_norm", "update_size"],
        steps=4,
        sinks=[seen.append],
        log=log,
        diagnoses=[{"name": "loss_plateau", "window": 3, "min_decrease": 0.99}],  # fires
    )
    cp = result.cockpit
    cp.log(1, train_loss=0.5)
    cp.add("distance")
    cp.close()
    folded = LogData()
    for record in seen:
        folded.add(record)
    read = read_run(log)
    written_only = {"log_format", "run"}  # what the log writer adds to the header
    assert folded.header == {k: v for k, v in read.header.items() if k not in written_only}
    assert folded.output.keys() == read.output.keys()
    for step, row in read.output.items():
        assert folded.output[step].keys() == row.keys()
        assert folded.output[step]["loss"] == row["loss"]
    assert folded.output[1]["metrics"] == {"train_loss": 0.5}
    assert folded.errors == read.errors and folded.skipped == read.skipped
    assert folded.findings == read.findings and folded.findings
    assert [q["name"] for q in folded.header["quantities"]][-1] == "distance"
