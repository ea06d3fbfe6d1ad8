"""The dashboard shows what the installed diagnoses find in the run, not only what ran while
training; findings come once each, grouped by diagnosis in the banner (issue 34)."""

import warnings

import matplotlib
import pytest
import torch
from cockpit_dashboard import render
from cockpit_dashboard.banner import findings_banner

from cockpit_core import Cockpit, Registry, hookimpl
from cockpit_core.cli.main import main
from cockpit_core.diagnosing.findings import merge, run_findings
from cockpit_core.diagnosis import Diagnosis, Finding
from cockpit_core.errors import CockpitWarning
from cockpit_core.log import LogData, read_run

matplotlib.use("Agg")

STEPS = 6
BANNER = "cockpit-findings-banner"


class Zero(torch.nn.Module):
    def forward(self, x):
        return 0.0 * x


def _dead_run(log=None):
    """Linear -> 0 x -> Tanh -> Linear: three parameters get no gradient; no diagnoses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), Zero(), torch.nn.Tanh(), torch.nn.Linear(3, 2)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    cp = Cockpit(model.named_parameters(), ["loss", "grad_norm"], log=log)
    for step in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
        opt.step()
    cp.close()
    return cp


def _banner(fig):
    found = [t for t in fig.texts if t.get_gid() == BANNER]
    return found[0].get_text() if found else None


def test_plot_shows_the_diagnoses_of_a_run_that_configured_none(tmp_path, capsys):
    cp = _dead_run(tmp_path / "log.jsonl")
    assert cp.findings == []  # nothing ran while training
    assert "WARNING dead_layers (steps 0-5)" in _banner(cp.plot())
    assert _banner(cp.plot(diagnose=False)) is None  # opted out: the recorded ones only
    # the log, from the command line
    assert main(["plot", str(tmp_path / "log.jsonl"), "-o", str(tmp_path / "d.svg")]) == 0
    assert BANNER in (tmp_path / "d.svg").read_text()
    assert "dead_layers" in (tmp_path / "d.svg").read_text()


def finding(fid, diagnosis, severity, first, last, message="found"):
    return Finding(fid, diagnosis, severity, first, last, message)


def test_a_finding_recorded_while_training_and_found_again_is_shown_once(tmp_path):
    _dead_run(tmp_path / "log.jsonl")
    data = read_run(tmp_path / "log.jsonl")
    # recorded while training: the same id, and the same condition dated differently
    data.findings = [
        finding("dead_layers@0", "dead_layers", "warning", 0, 4).to_record(),
        finding("dead_layers@2", "dead_layers", "warning", 2, 5).to_record(),
        finding("other@1", "not_installed", "info", 1, 1).to_record(),
    ]
    found, problems = run_findings(data)
    assert problems == []
    assert sorted(f.id for f in found) == ["dead_layers@0", "other@1"]
    (dead,) = [f for f in found if f.diagnosis == "dead_layers"]
    assert (dead.first_step, dead.last_step) == (0, 5)  # the whole log's stretch
    # a stretch that does not overlap one found now stays
    now = [finding("a@0", "a", "info", 0, 3)]
    logged = [finding("a@9", "a", "info", 9, 9), finding("a@0", "a", "info", 0, 1)]
    assert [f.id for f in merge(now, logged)] == ["a@0", "a@9"]


class Broken(Diagnosis):
    """Raises on every check."""

    name = "broken_rule"
    reads = ("loss",)
    source = "a test"

    def check(self, window):
        raise RuntimeError("boom")


class BrokenApplies(Broken):
    """Raises before its check is even called."""

    name = "broken_applies"

    def applies(self, window):
        raise ValueError("no")


class LossSeen(Diagnosis):
    """Always finds one thing at the first step."""

    name = "loss_seen"
    reads = ("loss",)
    source = "a test"

    def check(self, window):
        step = window.steps[0]
        return [self.finding("", "info", step, step, "the loss was there", {})]


def registry_of(*diagnoses):
    import cockpit_basic.plugin

    class Plugin:
        @hookimpl
        def register_diagnoses(self, register):
            for d in diagnoses:
                register(d)

    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic")
    assert registry.add_plugin(Plugin(), name="rules").ok
    return registry


@pytest.mark.parametrize("bad", [Broken, BrokenApplies])
def test_a_diagnosis_that_raises_is_skipped_and_named_not_the_plot(bad):
    registry = registry_of(bad, LossSeen)
    data = LogData({}, {s: {"loss": 1.0 / (s + 1)} for s in range(4)})
    with pytest.warns(CockpitWarning, match=bad.name):
        fig = render(data, registry=registry)
    assert "INFO    loss_seen (step 0): the loss was there" in _banner(fig)
    notes = [t.get_text() for t in fig.texts]
    assert any("Diagnoses skipped" in n and bad.name in n for n in notes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        render(data, registry=registry, diagnose=False)  # not run: nothing to say


def test_the_banner_has_a_line_per_diagnosis_with_its_other_stretches_counted():
    from matplotlib.figure import Figure

    dead = [finding(f"dead_layers@{s}", "dead_layers", "warning", s, s + 1) for s in (0, 5, 9, 14)]
    batch = [finding(f"batch_size@{s}", "batch_size", "warning", s, s + 2) for s in range(0, 25, 5)]
    info = [finding("loss_plateau@3", "loss_plateau", "info", 3, 40)]
    more = [finding("cost@0", "cost", "info", 0, 40), finding("x@1", "x", "info", 1, 1)]
    text = findings_banner(Figure(figsize=(14, 2)), info + batch + dead + more).get_text()
    assert text.splitlines() == [
        "WARNING batch_size (steps 0-2; 5 stretches): found",
        "WARNING dead_layers (steps 0-1; 4 stretches): found",
        "INFO    loss_plateau (steps 3-40): found",
        "... and 2 more (cockpit diagnose LOG lists all)",
    ]
