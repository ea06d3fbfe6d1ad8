"""The report of `cockpit diagnose`: order, grouping of stretches, and opposite advice.

The logs are written by hand (:class:`~cockpit_core.log.LogWriter`), with values chosen so
that each rule fires over known steps; see docs/diagnoses.md#the-report.
"""

import json
import warnings

import pytest

from cockpit_core import Registry, hookimpl
from cockpit_core.cli.main import main
from cockpit_core.diagnosing.run import (
    diagnose,
    exit_code,
    precedence_rules,
    report_entries,
    report_order,
    report_text,
)
from cockpit_core.diagnosis import Diagnosis, Finding, Precedence, check_diagnosis_class
from cockpit_core.log import LogWriter

PARAMS = [{"name": "w", "shape": [2], "numel": 2}, {"name": "b", "shape": [1], "numel": 1}]


def write_log(path, values, skipped=()):
    """A log of ``values`` (``{step: {key: value}}``) and ``skipped`` records."""
    writer = LogWriter(path, fsync_every=None)
    writer({"kind": "header", "quantities": [], "params": PARAMS})
    for step, vals in sorted(values.items()):
        writer({"kind": "values", "step": step, "values": vals})
    for record in skipped:
        writer({"kind": "skipped", **record})
    writer.close()
    return str(path)


def _run_that_died(step):
    """Values at ``step`` of a run whose parameter ``b`` goes dead at step 50."""
    failing = (step // 10) % 2 == 0 and step < 90  # 0-9, 20-29, ..., 80-89
    return {
        "norm_test": {"total": 2.0 if failing else 0.1},
        "grad_norm": {"total": 1.0, "per_param": [1.0, 0.0 if step >= 50 else 1.0]},
        "early_stopping": {"total": 1.0 if step >= 90 else -1.0},
    }


DIED = ["nonfinite", "dead_layers", "vanishing_gradients", "batch_size", "early_stopping"]


@pytest.fixture(scope="module")
def died(tmp_path_factory):
    """100 steps: a non-finite step 3 (error), b dead from 50, 5 batch-size stretches."""
    path = tmp_path_factory.mktemp("died") / "log.jsonl"
    values = {s: _run_that_died(s) for s in range(100) if s != 3}
    reason = "non-finite values: loss is nan; gradient of 'w' is not finite"
    return write_log(path, values, [{"step": 3, "quantities": ["loss"], "reason": reason}])


def test_findings_come_by_severity_then_latest_stretch_first(died):
    found = diagnose(died, names=DIED)
    assert [f.id for f in found] == [
        "nonfinite@3",  # the only error, although the earliest
        "dead_layers@50",  # warnings: the latest stretches first (50-99 ...
        "vanishing_gradients@50",  # ... the same stretch, advises a knob: after)
        "batch_size/norm_test@80",
        "batch_size/norm_test@60",
        "batch_size/norm_test@40",
        "batch_size/norm_test@20",
        "batch_size/norm_test@0",
        "early_stopping@86",  # the latest, but only info
    ]
    assert found == report_order(reversed(found))
    assert exit_code(found) == 1


def test_the_stretches_of_one_diagnosis_are_one_entry(died, capsys):
    entries = report_entries(diagnose(died, names=DIED))
    assert [e.head.diagnosis for e in entries] == [
        "nonfinite",
        "dead_layers",
        "vanishing_gradients",
        "batch_size",
        "early_stopping",
    ]
    batch = entries[3]
    assert [(f.first_step, f.last_step) for f in batch.findings] == [
        (80, 89),
        (60, 69),
        (40, 49),
        (20, 29),
        (0, 9),
    ]
    assert main(["diagnose", died, "--only", ",".join(DIED)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{died}: 1 error, 7 warnings, 1 info in 5 entries\n")
    lines = out.splitlines()
    heads = [line for line in lines if line.startswith("  ") and not line.startswith("    ")]
    assert [h.split()[:2] for h in heads] == [
        ["ERROR", "nonfinite:"],
        ["WARNING", "dead_layers:"],
        ["WARNING", "vanishing_gradients:"],
        ["WARNING", "batch_size:"],
        ["INFO", "early_stopping:"],
    ]
    assert heads[3].endswith("(steps 80-89; 5 stretches)")
    assert "      stretches (latest first): 80-89, 60-69, 40-49, 20-29, 0-9" in lines
    assert "      evidence (steps 80-89): median_theta_max=2, theta=0.8" in out
    assert out.count("suggestion: Grow the batch") == 1


def test_json_keeps_every_finding_and_adds_the_entries(died, capsys):
    assert main(["diagnose", died, "--only", ",".join(DIED), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 1
    (log,) = data["logs"]
    assert [f["id"] for f in log["findings"]] == [f.id for f in diagnose(died, names=DIED)]
    assert all(f["kind"] == "finding" for f in log["findings"])
    assert [f["entry"] for f in log["findings"]] == [0, 1, 2, 3, 3, 3, 3, 3, 4]
    batch = log["entries"][3]
    assert batch["kind"] == "group" and batch["diagnosis"] == "batch_size"
    assert batch["ids"] == [f"batch_size/norm_test@{s}" for s in (80, 60, 40, 20, 0)]
    assert batch["stretches"] == [[80, 89], [60, 69], [40, 49], [20, 29], [0, 9]]
    assert batch["advice"] == {"batch_size": "up", "learning_rate": "down"}
    assert log["findings"][3]["advice"] == batch["advice"]
    assert "advice" not in log["findings"][1]  # dead_layers advises no knob


def test_a_trained_run_that_died_leads_with_the_dead_layers(tmp_path, capsys):
    """The dead_layer demo with the norm test tracked: batch-size warnings come after."""
    pytest.importorskip("sklearn")
    from cockpit_demo.scenarios import make_dead_model
    from cockpit_demo.training import run_demo

    with warnings.catch_warnings():  # the run's own warnings (its findings); not checked here
        warnings.simplefilter("ignore")
        run = run_demo(
            "loss,grad_norm,norm_test",
            steps=40,
            out=tmp_path,
            picture=False,
            build_model=make_dead_model,
        )
    capsys.readouterr()
    log = str(run / "log.jsonl")
    found = diagnose(log)
    assert {"dead_layers", "batch_size"} <= {f.diagnosis for f in found}
    entries = report_entries(found)
    assert entries[0].head.id == "dead_layers@0"
    assert main(["diagnose", log]) == 1
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  W")]
    assert heads[0].startswith("  WARNING dead_layers: 3 parameter(s) get an exactly zero")
    assert any(h.startswith("  WARNING batch_size:") for h in heads[1:])


def test_the_lr_too_high_scenario_leads_with_the_dead_layers_and_raises_no_learning_rate(
    tmp_path, capsys
):
    """lr 3 for 100 steps: the ReLUs die at about step 11, the loss flattens after."""
    pytest.importorskip("sklearn")
    from cockpit_demo.scenarios import run_scenario

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run, code = run_scenario("lr_too_high", steps=100, out=tmp_path)
    out = capsys.readouterr().out
    assert code == 1
    found = diagnose(run / "log.jsonl")
    entries = report_entries(found)
    assert entries[0].head.diagnosis == "dead_layers"
    assert "step_size" in {e.head.diagnosis for e in entries}
    # no entry stands that advises raising the learning rate: a plateau is overruled
    assert not [e for e in entries if e.head.advice.get("learning_rate") == "up"]
    plateaus = [f for f in found if f.diagnosis == "loss_plateau"]
    overruled = [o.finding for e in entries for o in e.overruled]
    assert all(p in overruled for p in plateaus)
    assert "suggestion: If the loss is still high, raise the learning rate" not in out


# -- opposite advice -----------------------------------------------------------------------


def _overshoot_on_a_plateau(step):
    """alpha 0.5 (every step overshoots) while the loss falls by 2.5 % over 50 steps."""
    return {"alpha": {"alpha": 0.5}, "loss": 2.0 - 0.001 * step}


@pytest.fixture(scope="module")
def overshoot(tmp_path_factory):
    path = tmp_path_factory.mktemp("overshoot") / "log.jsonl"
    return write_log(path, {s: _overshoot_on_a_plateau(s) for s in range(60)})


def test_a_plateau_does_not_raise_the_learning_rate_against_a_too_large_step(overshoot, capsys):
    found = diagnose(overshoot, names=["step_size", "loss_plateau"])
    assert [f.id for f in found] == ["step_size/overshoot@0", "loss_plateau@0"]
    assert [f.advice for f in found] == [{"learning_rate": "down"}, {"learning_rate": "up"}]
    (entry,) = report_entries(found)
    assert entry.head.id == "step_size/overshoot@0"
    (overruled,) = entry.overruled
    assert overruled.finding.id == "loss_plateau@0" and overruled.knob == "learning_rate"
    assert "not a reason to raise the learning rate" in overruled.because
    assert main(["diagnose", overshoot, "--only", "step_size,loss_plateau"]) == 1
    out = capsys.readouterr().out
    assert "Raise the learning rate" not in out and "raise the learning rate or" not in out
    assert "suggestion: Lower the learning rate" in out
    assert "      overrules loss_plateau (info, steps 0-59): the loss fell by only " in out
    assert '          not "raise the learning rate": the step is already too large' in out
    assert main(["diagnose", overshoot, "--only", "step_size,loss_plateau", "--json"]) == 1
    (log,) = json.loads(capsys.readouterr().out)["logs"]
    assert len(log["findings"]) == 2 and len(log["entries"]) == 1
    plateau = log["findings"][1]
    assert plateau["overruled_by"]["id"] == "step_size/overshoot@0"
    assert plateau["overruled_by"]["knob"] == "learning_rate"
    assert log["entries"][0]["overruled"][0]["direction"] == "up"


def test_advice_in_the_same_direction_or_at_other_steps_is_no_conflict(tmp_path):
    # alpha -0.9: steps too small; a flat loss agrees (both: raise the learning rate)
    path = write_log(
        tmp_path / "low.jsonl", {s: {"alpha": {"alpha": -0.9}, "loss": 2.0} for s in range(60)}
    )
    entries = report_entries(diagnose(path, names=["step_size", "loss_plateau"]))
    assert [e.head.id for e in entries] == ["step_size/undershoot@0", "loss_plateau@0"]
    assert not any(e.overruled or e.conflict for e in entries)
    # opposite advice over steps that do not overlap: each stands, at its steps
    down = Finding("a@0", "a", "warning", 0, 9, "m", advice={"learning_rate": "down"})
    up = Finding("b@20", "b", "warning", 20, 29, "m", advice={"learning_rate": "up"})
    entries = report_entries([down, up], rules=[])
    assert [e.head.id for e in entries] == ["b@20", "a@0"]
    assert not any(e.overruled or e.conflict for e in entries)


def test_opposite_advice_without_a_rule_is_one_conflict_entry_naming_both():
    up, down = {"batch_size": "up"}, {"batch_size": "down"}
    grow = Finding("batch_size/norm_test@0", "batch_size", "warning", 0, 50, "noisy", advice=up)
    shrink = Finding("small_batch@10", "small_batch", "info", 10, 40, "m", advice=down)
    other = Finding("dead_layers@0", "dead_layers", "warning", 0, 60, "dead")
    entries = report_entries([shrink, other, grow], rules=[])
    assert [e.conflict for e in entries] == [(), ("batch_size",)]
    conflict = entries[1]
    assert [f.id for f in conflict.findings] == ["batch_size/norm_test@0", "small_batch@10"]
    assert conflict.severity == "warning"
    text = report_text("log.jsonl", [shrink, other, grow], entries)
    assert (
        "  WARNING conflict: batch_size, small_batch advise opposite directions on the batch "
        "size over steps 0-50, and no rule says whose evidence wins" in text
    )
    assert "      raise the batch size: batch_size (warning, steps 0-50): noisy" in text
    assert "      lower the batch size: small_batch (info, steps 10-40): m" in text
    data = conflict.to_json()
    assert data["kind"] == "conflict" and data["knobs"] == ["batch_size"]
    assert data["sides"] == {
        "batch_size": {"up": ["batch_size/norm_test@0"], "down": ["small_batch@10"]}
    }
    # a rule each way decides nothing either
    both = [
        Precedence("batch_size", ("batch_size",), ("small_batch",), "x"),
        Precedence("batch_size", ("small_batch",), ("batch_size",), "y"),
    ]
    assert [e.conflict for e in report_entries([shrink, grow], rules=both)] == [("batch_size",)]
    # one rule: resolved
    (entry,) = report_entries([shrink, grow], rules=both[:1])
    assert entry.head is grow and entry.overruled[0].finding is shrink


class Diverging(Diagnosis):
    """A third party's rule: its finding outranks step_size/undershoot on the learning rate."""

    name = "diverging"
    reads = ("loss",)
    source = "a test rule"
    precedence = (
        Precedence("learning_rate", ("diverging",), ("step_size/undershoot",), "the loss diverges"),
    )

    def check(self, window):
        steps, loss = window.series("loss")
        if not len(steps) or loss[-1] <= loss[0]:
            return []
        return [
            self.finding(
                "",
                "warning",
                steps[0],
                steps[-1],
                "the loss diverges",
                {},
                "Lower the learning rate.",
                advice={"learning_rate": "down"},
            )
        ]


class DivergingPlugin:
    @hookimpl
    def register_diagnoses(self, register):
        register(Diverging)


def test_a_third_party_declares_its_advice_and_its_precedence(tmp_path):
    check_diagnosis_class(Diverging)
    registry = Registry.from_entry_points()
    assert registry.add_plugin(DivergingPlugin(), name="diverging").ok
    rules = precedence_rules(registry)
    assert Diverging.precedence[0] in rules
    assert any("step_size/overshoot" in r.wins for r in rules)  # the first-party table
    path = write_log(
        tmp_path / "log.jsonl",
        {s: {"alpha": {"alpha": -0.9}, "loss": 1.0 + 0.1 * s} for s in range(20)},
    )
    found = diagnose(path, registry, names=["diverging", "step_size"])
    assert {f.id for f in found} == {"diverging@0", "step_size/undershoot@0"}
    (entry,) = report_entries(found, rules)
    assert entry.head.id == "diverging@0"
    assert entry.overruled[0].because == "the loss diverges"


def test_advice_is_optional_and_checked():
    old = {"id": "x@0", "diagnosis": "x", "severity": "info", "first_step": 0, "last_step": 0}
    finding = Finding.from_record({**old, "message": "m"})
    assert finding.advice == {} and "advice" not in finding.to_record()
    bad = {**old, "message": "m", "advice": {"learning_rate": "sideways"}}
    assert Finding.from_record(bad).advice == {}  # a reader drops what it cannot use
    with pytest.raises(ValueError, match="advice"):
        Finding("x@0", "x", "info", 0, 0, "m", advice={"learning_rate": "sideways"})
    with pytest.raises(TypeError, match="precedence"):

        class Bad(Diverging):
            precedence = ["not a rule"]

        check_diagnosis_class(Bad)
