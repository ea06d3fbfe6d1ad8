"""The diagnosis protocol: spans, findings as log records, the hook, running on and offline."""

import itertools
import warnings

import numpy as np
import pytest
from pydantic import Field

from cockpit_core import Registry, hookimpl
from cockpit_core.diagnosing.run import diagnose
from cockpit_core.diagnosing.runner import DiagnosisRunner
from cockpit_core.diagnosis import (
    Diagnosis,
    DiagnosisConfig,
    Finding,
    UnknownDiagnosisError,
    Window,
    persistent_spans,
)
from cockpit_core.errors import CockpitWarning, ConfigError
from cockpit_core.log import LogFormatError, read_records, read_run
from cockpit_core.testing import run_cockpit, tiny_mlp


class LossAboveConfig(DiagnosisConfig):
    threshold: float = Field(1.0, description="Report a loss above this.")


class LossAbove(Diagnosis):
    """A third-party diagnosis written as docs/diagnoses.md shows."""

    name = "loss_above"
    reads = ("loss",)
    source = "a test rule"
    Config = LossAboveConfig

    def check(self, window):
        steps, loss = window.series("loss")
        high = steps[loss > self.config.threshold]
        if not len(high):
            return []
        return [
            self.finding("", "warning", high[0], high[-1], "loss is high", {"max_loss": loss.max()})
        ]


class Plugin:
    @hookimpl
    def register_diagnoses(self, register):
        register(LossAbove)


def registry_of():
    registry = Registry.from_entry_points()
    info = registry.add_plugin(Plugin(), name="thirdparty", distribution="cockpit-thirdparty")
    assert info.ok, info.error
    return registry


def _reference_spans(steps, flags, window, fraction):
    """Brute force: mark every flagged entry of a qualifying window, then group runs."""
    need = int(np.ceil(fraction * window - 1e-9))
    hot = [i for i in range(len(flags) - window + 1) if sum(flags[i : i + window]) >= need]
    groups = []
    for i in hot:
        if groups and i <= groups[-1][1] + 1:
            groups[-1][1] = i + window - 1
        else:
            groups.append([i, i + window - 1])
    out = []
    for lo, hi in groups:
        idx = [j for j in range(lo, hi + 1) if flags[j]]
        out.append((steps[idx[0]], steps[idx[-1]], len(idx)))
    return out


def test_persistent_spans_match_a_brute_force_reference():
    rng = np.random.default_rng(0)
    for n, window, fraction in itertools.product([0, 3, 12, 40], [1, 3, 5], [0.5, 0.8, 1.0]):
        for _ in range(5):
            flags = (rng.random(n) < 0.6).tolist()
            steps = sorted(rng.choice(1000, size=n, replace=False).tolist())
            got = persistent_spans(steps, flags, window, fraction)
            assert got == _reference_spans(steps, flags, window, fraction)


def test_window_series_reads_fields_and_marks_missing_values_nan():
    window = Window({2: {"a": {"total": 1.5}}, 0: {"a": {"total": "x"}}, 1: {"b": 1}})
    steps, values = window.series("a", "total")
    assert steps.tolist() == [0, 2] and np.isnan(values[0]) and values[1] == 1.5
    steps, values = window.finite_series("a", "total")
    assert steps.tolist() == [2] and values.tolist() == [1.5]
    out = {0: {"g": {"per_param": np.array([1.0, 2.0])}}, 1: {"g": {"per_param": [3.0]}}}
    steps, per = Window(out).per_param("g")
    assert steps.tolist() == [0] and per.tolist() == [[1.0, 2.0]]


def test_findings_are_log_records_that_read_back(tmp_path):
    finding = Finding("x@3", "x", "warning", 3, 5, "m", {"v": 1.0}, "s", "paper")
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"kind": "header", "run": 1}\n'
        '{"kind": "values", "step": 3, "values": {"loss": 1.0}}\n'
        + __import__("json").dumps(finding.to_record())
        + "\n"
    )
    data = read_run(path)
    assert [Finding.from_record(r) for r in data.findings] == [finding]
    path.write_text('{"kind": "finding", "id": "x", "severity": "fatal"}\n')
    with pytest.raises(LogFormatError, match="line 1: a 'finding' record needs"):
        read_run(path)
    with pytest.raises(ValueError, match="severity 'fatal'"):
        Finding("x", "x", "fatal", 0, 0, "m")


def test_hook_register_diagnoses(tmp_path):
    registry = registry_of()
    assert registry.diagnoses.lookup("loss_above").distribution == "cockpit-thirdparty"
    seen = []
    with pytest.warns(CockpitWarning, match="loss_above: loss is high") as caught:
        result = run_cockpit(
            tiny_mlp(),
            ["loss"],
            steps=4,
            registry=registry,
            diagnoses=[{"name": "loss_above", "threshold": 0.0}],
            sinks=[seen.append],
            log=tmp_path / "log.jsonl",
        )
    result.cockpit.close()
    assert sum("loss_above" in str(w.message) for w in caught) == 1  # once per finding id
    (finding,) = result.cockpit.findings
    assert (finding.id, finding.first_step, finding.source) == ("loss_above@0", 0, "a test rule")
    assert finding.last_step == 3  # at close: the whole stretch
    # the log and every sink receive the finding record, right after the values of step 0,
    # and once more at close with the stretch it grew to (same id; the reader keeps the last)
    records = list(read_records(tmp_path / "log.jsonl"))
    kinds = [r["kind"] for r in records]
    assert kinds[:3] == ["header", "values", "finding"] and kinds.count("finding") == 2
    first, last = (r for r in records if r["kind"] == "finding")
    assert (first["id"], first["last_step"]) == ("loss_above@0", 0)
    assert (last["id"], last["last_step"]) == ("loss_above@0", 3)
    assert read_run(tmp_path / "log.jsonl").findings == [
        {k: v for k, v in last.items() if k != "kind"}
    ]
    assert [r["kind"] for r in seen] == kinds
    # offline, the same rule over the whole log finds the stretch of every step
    losses = [v["loss"] for v in result.cockpit.get_output().values()]
    (offline,) = diagnose(
        tmp_path / "log.jsonl", registry, names=[{"name": "loss_above", "threshold": 0.0}]
    )
    assert (offline.first_step, offline.last_step) == (0, 3)
    assert offline.evidence["max_loss"] == max(losses)
    # cp.write keeps the findings in the consolidated file
    written = read_run(result.cockpit.write(tmp_path / "output.json"))
    assert [Finding.from_record(r) for r in written.findings] == [finding]
    # and the dashboard of the run (the Cockpit's and the log's) shows it in its banner
    from cockpit_dashboard import render

    for source in (result.cockpit, tmp_path / "log.jsonl"):
        texts = [t.get_text() for t in render(source).texts]
        assert any("loss_above (steps 0-3): loss is high" in t for t in texts), source


def test_unknown_names_and_bad_options_are_clear_errors():
    registry = registry_of()
    with pytest.raises(UnknownDiagnosisError, match="Did you mean 'loss_above'"):
        diagnose({0: {"loss": 1.0}}, registry, names=["loss_abov"])
    with pytest.raises(ConfigError, match="diagnoses.loss_above.treshold"):
        diagnose({0: {"loss": 1.0}}, registry, names=[{"name": "loss_above", "treshold": 1}])


@pytest.mark.parametrize(
    "bad, says",
    [
        (int, "is not a subclass"),
        (type("Bad", (LossAbove,), {"name": "Bad-Name"}), "not a valid diagnosis name"),
        (type("NoCheck", (Diagnosis,), {"name": "no_check"}), "must implement check"),
        (type("Kinds", (LossAbove,), {"name": "kinds", "reads_records": ("values",)}), "('cost',)"),
    ],
)
def test_invalid_diagnosis_classes_skip_only_the_diagnoses(bad, says):
    class BadPlugin:
        @hookimpl
        def register_diagnoses(self, register):
            register(bad)

    registry = Registry(builtin=True)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        info = registry.add_plugin(BadPlugin(), name="bad")
    assert info.ok and says in registry.extension_errors["bad"]
    assert not list(registry.diagnoses.items())


def test_a_failing_diagnosis_is_skipped_with_a_warning():
    class Broken(LossAbove):
        name = "broken"

        def check(self, window):
            raise RuntimeError("boom")

    runner = DiagnosisRunner([Broken(), LossAbove(threshold=0.5)])
    with pytest.warns(CockpitWarning, match="'broken' failed and was skipped: RuntimeError"):
        found = runner.observe({"kind": "values", "step": 0, "values": {"loss": 1.0}})
    assert [f.id for f in found] == ["loss_above@0"]
    assert runner.observe({"kind": "values", "step": 1, "values": {"loss": 1.0}}) == []


class SlowSteps(Diagnosis):
    """Reads ``cost`` records only: a step whose block took more than a second."""

    name = "slow_steps"
    reads_records = ("cost",)
    source = "a test rule"

    def check(self, window):
        slow = [r["step"] for r in window.records("cost") if r["block_s"] > 1.0]
        return [self.finding("", "info", s, s, "slow", {}) for s in slow]


def test_a_rule_that_reads_records_runs_on_them_online_and_offline(tmp_path):
    cost = [{"kind": "cost", "step": s, "block_s": float(s)} for s in range(3)]
    counted = []

    class Counting(LossAbove):
        name = "counting"

        def check(self, window):
            counted.append(len(window.cost))
            return []

    runner = DiagnosisRunner([SlowSteps(), Counting()], max_steps=2)
    assert not SlowSteps().applies(Window({0: {"loss": 1.0}})) and SlowSteps().applies(
        Window({}, cost=cost)
    )
    found = [[f.id for f in runner.observe(r)] for r in cost]
    assert found == [[], [], ["slow_steps@2"]] and len(runner.cost) == 2
    runner.observe({"kind": "values", "step": 3, "values": {"loss": 0.5}})
    assert counted == [2]  # value readers run on values records only, and see the cost
    # without a rule that reads them, the runner keeps no cost records
    only_values = DiagnosisRunner([LossAbove()])
    assert only_values.observe(cost[2]) == [] and only_values.cost == []
    log = tmp_path / "log.jsonl"
    log.write_text("".join(f'{{"kind":"cost","step":{s},"block_s":{s}.5}}\n' for s in range(3)))
    assert read_run(log).cost == [{"kind": "cost", "step": s, "block_s": s + 0.5} for s in range(3)]
    registry = Registry(builtin=True)
    assert registry.add_plugin(SlowPlugin(), name="slow").ok
    # a report lists the latest stretch first (docs/diagnoses.md#the-report)
    assert [f.id for f in diagnose(log, registry)] == ["slow_steps@2", "slow_steps@1"]


class SlowPlugin:
    @hookimpl
    def register_diagnoses(self, register):
        register(SlowSteps)


def test_findings_banner_shows_the_most_severe_first():
    from cockpit_dashboard.banner import COLORS, findings_banner
    from matplotlib.figure import Figure

    info = Finding("a@0", "a", "info", 0, 9, "just so")
    error = Finding("b@5", "b", "error", 5, 5, "broken")
    fig = Figure()
    assert findings_banner(fig, []) is None
    text = findings_banner(fig, [info, error.to_record()], most=1)
    assert text.get_text() == (
        "ERROR   b (step 5): broken\n... and 1 more (cockpit diagnose LOG lists all)"
    )
    assert text.get_bbox_patch().get_facecolor()[:3] == pytest.approx(
        tuple(int(COLORS["error"][i : i + 2], 16) / 255 for i in (1, 3, 5))
    )
