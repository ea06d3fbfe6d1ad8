"""Findings in the web view: listed in the page's data and shaded on the panels they read."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
import torch
from cockpit_web import Feed, LogFollower

from cockpit_core import Cockpit
from cockpit_core.cli.main import main

STEPS = 6


class Zero(torch.nn.Module):
    def forward(self, x):
        return 0.0 * x


def _dead_log(path, diagnoses):
    """Linear(4, 3) -> 0 x -> Tanh -> Linear(3, 2): three parameters get no gradient."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), Zero(), torch.nn.Tanh(), torch.nn.Linear(3, 2)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    # a finding while training is also a CockpitWarning
    with pytest.warns(Warning, match="dead_layers") if diagnoses else contextlib.nullcontext():
        cp = Cockpit(model.named_parameters(), ["loss", "grad_norm"], log=path, diagnoses=diagnoses)
        for step in range(STEPS):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            with cp(step, info={"loss": loss}):
                loss.backward()
            opt.step()
        cp.close()
    return path


def _panel(payload, panel_id):
    return next(p for p in payload["panels"] if p["id"] == panel_id)


def test_logged_finding_is_listed_and_shaded_on_the_grad_norm_panel(tmp_path):
    log = _dead_log(tmp_path / "log.jsonl", ["dead_layers"])
    follower = LogFollower(log, "run")
    follower.poll()
    (record,) = follower.findings.values()
    # dead_layers needs 5 tracked steps: reported while training at step 4, and logged
    # again at close with its whole stretch (the follower keeps the last record of an id)
    assert record["id"] == "dead_layers@0" and (record["first_step"], record["last_step"]) == (0, 5)

    payload = Feed([log], diagnose=False).payload()  # only what the log recorded
    (entry,) = payload["findings"]
    assert entry["id"] == "dead_layers@0" and entry["severity"] == "warning"
    assert entry["run"] == tmp_path.name  # the run folder's name
    # dead_layers reads grad_norm only: its total and its per-parameter lines
    assert entry["panels"] == ["grad_norm", "grad_norm-per_param"]
    (shape,) = _panel(payload, "grad_norm")["figure"]["layout"]["shapes"]
    assert (shape["x0"], shape["x1"]) == (-0.5, 5.5) and shape["yref"] == "paper"
    assert shape["name"] == "dead_layers@0" and shape["type"] == "rect"
    assert "shapes" not in _panel(payload, "loss")["figure"]["layout"]


def test_plot_html_runs_the_diagnoses_and_embeds_the_findings(tmp_path, capsys):
    log = _dead_log(tmp_path / "dead.jsonl", None)  # no diagnoses while training
    assert LogFollower(log, "dead").poll()
    assert Feed([log], diagnose=False).payload()["findings"] == []  # none recorded
    out = tmp_path / "dash.html"
    assert main(["plot", str(log), "-o", str(out)]) == 0
    page = out.read_text()
    assert '<div id="cockpit-findings"></div>' in page and "showFindings" in page
    data = json.loads(
        re.search(r'<script id="cockpit-data" type="application/json">(.*?)</script>', page)[1]
    )
    (entry,) = data["findings"]
    # offline the whole log is seen: steps 0 to 5
    assert entry["id"] == "dead_layers@0" and (entry["first_step"], entry["last_step"]) == (0, 5)
    assert entry["message"].endswith("zero gradient: 0.weight, 0.bias, 3.weight")
    (shape,) = _panel(data, "grad_norm")["figure"]["layout"]["shapes"]
    assert (shape["x0"], shape["x1"]) == (-0.5, 5.5)


def test_healthy_log_has_no_findings(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    log = tmp_path / "log.jsonl"
    cp = Cockpit(model.named_parameters(), ["loss", "grad_norm"], log=log)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    for step in range(STEPS):
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
    cp.close()
    payload = Feed([log], diagnose=True).payload()
    assert payload["findings"] == []
    assert all("shapes" not in p["figure"]["layout"] for p in payload["panels"])


def test_serve_runs_the_rules_over_a_log_recorded_without_them(tmp_path, monkeypatch):
    from cockpit_web import make_server

    log = _dead_log(tmp_path / "dead.jsonl", None)  # no diagnoses while training
    with make_server([log], port=0, diagnose=False) as server:
        assert server.feed.payload()["findings"] == []  # only what the log recorded
    with make_server([log], port=0) as server:  # by default: the diagnoses run
        (entry,) = server.feed.payload()["findings"]
    assert entry["id"] == "dead_layers@0" and entry["panels"] == [
        "grad_norm",
        "grad_norm-per_param",
    ]
    assert (entry["first_step"], entry["last_step"]) == (0, STEPS - 1)
    # the command line runs them by default; --no-diagnose shows the recorded findings only
    seen = {}
    monkeypatch.setattr("cockpit_web.command.serve", lambda runs, **kw: seen.update(kw))
    assert main(["serve", str(log)]) == 0 and seen["diagnose"] is True
    assert main(["serve", str(log), "--no-diagnose"]) == 0 and seen["diagnose"] is False


def test_findings_are_grouped_one_row_per_diagnosis_and_run(tmp_path):
    from cockpit_core.diagnosis import Finding
    from cockpit_core.log import dumps

    logs = []
    for name, stretches in (("a", [(8, 9), (0, 1), (4, 5)]), ("b", [(2, 3)])):
        log = _dead_log(tmp_path / name / "log.jsonl", None)
        with open(log, "a") as f:
            for first, last in stretches:
                found = Finding(f"batch_size@{first}", "batch_size", "warning", first, last, "m")
                f.write(dumps(found.to_record()) + "\n")
        logs.append(log)
    payload = Feed(logs).payload()  # the diagnoses find dead_layers in both
    assert len(payload["findings"]) == 6  # every stretch is still an entry (and a span)
    rows = {(g["run"], g["diagnosis"]): g for g in payload["finding_groups"]}
    assert sorted(rows) == [("a", "batch_size"), ("a", "dead_layers")] + [
        ("b", "batch_size"),
        ("b", "dead_layers"),
    ]
    batch = rows[("a", "batch_size")]
    assert (batch["count"], batch["first_step"], batch["last_step"]) == (3, 0, 9)
    assert [s["id"] for s in batch["stretches"]] == ["batch_size@0", "batch_size@4", "batch_size@8"]
    assert rows[("b", "dead_layers")]["panels"] == ["grad_norm"]  # several runs: totals only


def test_a_failing_diagnosis_is_named_on_the_page_and_the_others_still_run(tmp_path, monkeypatch):
    from cockpit_core import Registry, hookimpl
    from cockpit_core.diagnosis import Diagnosis

    class Broken(Diagnosis):
        name = "broken_rule"
        reads = ("loss",)
        source = "a test"

        def applies(self, window):  # outside the check: the diagnoses cannot run together
            raise RuntimeError("boom")

        def check(self, window):
            return []

    class Plugin:
        @hookimpl
        def register_diagnoses(self, register):
            register(Broken)

    import cockpit_diagnoses.plugin

    registry = Registry()
    registry.add_plugin(cockpit_diagnoses.plugin, name="diagnoses")
    assert registry.add_plugin(Plugin(), name="broken").diagnoses == ["broken_rule"]
    monkeypatch.setattr("cockpit_core.plugin.registry.default_registry", lambda: registry)
    log = _dead_log(tmp_path / "log.jsonl", None)
    payload = Feed([log]).payload()
    assert [f["diagnosis"] for f in payload["findings"]] == ["dead_layers"]
    (problem,) = payload["runs"][0]["problems"]
    assert "broken_rule" in problem and "RuntimeError: boom" in problem


def test_the_diagnoses_of_a_growing_log_run_again_only_when_due(tmp_path, monkeypatch):
    from cockpit_core.log import dumps, loads

    log = _dead_log(tmp_path / "log.jsonl", None)
    last = [loads(line) for line in log.read_text().splitlines()]
    last = [r for r in last if r.get("kind") == "values"][-1]

    def grow(step):
        with open(log, "a") as f:
            f.write(dumps({**last, "step": step}) + "\n")

    def stretch(feed):
        (entry,) = feed.payload()["findings"]
        return entry["first_step"], entry["last_step"]

    monkeypatch.setattr("cockpit_web.feed.DIAGNOSE_SHARE", 1e-9)  # next run: never
    feed = Feed([log])
    assert stretch(feed) == (0, STEPS - 1)
    grow(STEPS)
    before = feed.version
    assert stretch(feed) == (0, STEPS - 1)  # the page is new, its findings the last ones
    assert feed.version > before
    monkeypatch.setattr("cockpit_web.feed.DIAGNOSE_SHARE", 1e9)  # next run: at once
    feed = Feed([log])
    assert stretch(feed) == (0, STEPS)
    grow(STEPS + 1)
    assert stretch(feed) == (0, STEPS + 1)
    version = feed.version
    assert feed.payload()["version"] == version  # nothing new: nothing run again
