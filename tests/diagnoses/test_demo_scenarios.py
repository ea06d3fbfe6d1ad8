"""`cockpit demo --scenario NAME`: each bad scenario produces its finding, healthy none."""

import json

import pytest
from cockpit_demo.scenarios import SCENARIOS

from cockpit_core.cli.main import main

pytestmark = pytest.mark.filterwarnings("ignore::cockpit_core.errors.CockpitWarning")
STEPS = 12  # the persistence windows are 10 tracked steps (dead_layers: 5)
PERSISTENT = [name for name, s in SCENARIOS.items() if s.spike is None]
"""The scenarios whose finding lasts from the start; ``spike`` has a test of its own."""


@pytest.mark.parametrize("name", PERSISTENT)
def test_scenario_gives_its_finding_and_diagnose_agrees(name, tmp_path, capsys):
    pytest.importorskip("sklearn")
    expected = SCENARIOS[name].expected
    code = main(["demo", "--scenario", name, "--steps", str(STEPS), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == (1 if expected else 0)
    log = str(tmp_path / "log.jsonl")
    assert main(["diagnose", log, "--json"]) == code
    findings = json.loads(capsys.readouterr().out)["logs"][0]["findings"]
    if not expected:  # at most cost's note that a tiny model's step costs less than cockpit's
        assert all(f["diagnosis"] == "cost" and f["severity"] == "info" for f in findings)
        assert not findings or "1 info" in out and "cockpit adds at least" in out
        assert findings or f"{log}: no findings" in out
        return
    ids = [f["id"] for f in findings]
    assert any(i.startswith(expected + "@") or i.startswith(expected + "/") for i in ids), ids
    mine = next(f for f in findings if f["id"].startswith(expected))
    assert mine["first_step"] <= 2 and mine["last_step"] >= STEPS - 4
    assert mine["message"] in out  # the demo printed the report of cockpit diagnose
    # the finding was also recorded in the log while training (the scenario runs it)
    with open(log) as fh:
        logged = [json.loads(line) for line in fh if '"finding"' in line]
    assert any(r["kind"] == "finding" and r["diagnosis"] == mine["diagnosis"] for r in logged)


def test_list_and_unknown_scenario(capsys):
    assert main(["demo", "--scenario", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SCENARIOS)
    assert main(["demo", "--scenario", "lr_too_hi"]) == 2
    err = capsys.readouterr().err
    assert "unknown scenario 'lr_too_hi'" in err and "lr_too_high" in err


def test_dead_layer_scenario_names_the_parameters_cut_off(tmp_path, capsys):
    pytest.importorskip("sklearn")
    main(["demo", "--scenario", "dead_layer", "--steps", "6", "--out", str(tmp_path)])
    # bias -100 on Linear(64, 32) with inputs in [0, 1]: every pre-activation is below
    # -100 + 64 * max|w| < 0 (default init |w| <= 1/8), so ReLU passes no gradient
    assert "0.weight, 0.bias, 2.weight (steps 0-5)" in capsys.readouterr().out


def test_the_spike_scenario_gives_a_loss_spike_right_after_the_spiked_update(tmp_path, capsys):
    pytest.importorskip("sklearn")
    scenario = SCENARIOS["spike"]
    assert scenario.spike == (0.7, 30.0) and scenario.steps == 100
    lr_at = scenario.lr_at(100)
    assert lr_at is not None and [lr_at(s) for s in (69, 70, 71)] == [0.1, 3.0, 0.1]
    assert main(["demo", "--scenario", "spike", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    log = str(tmp_path / "log.jsonl")
    assert main(["diagnose", log, "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["logs"][0]["findings"]
    # the update of step 70 is made with lr 3; the loss of step 71 is measured after it
    spikes = [f for f in findings if f["diagnosis"] == "loss_spike"]
    assert [f["id"] for f in spikes] == ["loss_spike@71"]
    (spike,) = spikes
    assert spike["severity"] == "warning" and spike["message"] in out
    assert spike["evidence"]["z_score"] > 6 and spike["evidence"]["grad_norm_jumps"]
    assert any(f["id"] == "grad_norm_spike@71" for f in findings)
    assert not any(f["diagnosis"] == "nonfinite" for f in findings)  # it recovers
    with open(log) as fh:  # found while training too
        logged = [json.loads(line) for line in fh if '"finding"' in line]
    assert any(r["kind"] == "finding" and r["id"] == "loss_spike@71" for r in logged)
