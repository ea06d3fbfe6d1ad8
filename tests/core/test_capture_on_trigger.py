"""Capture on trigger: a quantity with an ``on_finding`` schedule runs after a finding.

Real training of a tiny MLP with fixed seeds and a test diagnosis, ``at_step``, that fires
at the steps it is given (or ``loss_above``, when the loss crosses a threshold), so that the
tests depend on no first-party rule. The triggered quantity must be recorded on exactly the
steps after the finding, with the values a Cockpit tracking it at every step computes.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import Field

from cockpit_core import Cockpit, OnFinding, Registry, hookimpl
from cockpit_core.config.files import load_config_file, resolve_quantities
from cockpit_core.config.validation import validate_config_data
from cockpit_core.diagnosing.runner import CHECKS_PER_WINDOW, DiagnosisRunner
from cockpit_core.diagnosing.triggers import Triggers
from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window
from cockpit_core.errors import CockpitWarning, ConfigError, MisuseError
from cockpit_core.log import read_records

# -- test diagnoses ---------------------------------------------------------------------------


class AtStepConfig(DiagnosisConfig):
    steps: list[int] = Field(default_factory=list, description="Fire at these steps.")
    severity: str = Field("warning", description="Severity of the findings.")


class AtStep(Diagnosis):
    """Fires at each of the configured steps the window holds a loss for."""

    name = "at_step"
    reads = ("loss",)
    source = "a test rule"
    Config = AtStepConfig
    config: AtStepConfig

    def check(self, window: Window) -> list[Finding]:
        return [
            self.finding("", self.config.severity, s, s, f"step {s}", {"step": s})
            for s in window.steps
            if s in self.config.steps and "loss" in window.output[s]
        ]


class OtherStep(AtStep):
    """The same rule under another name (a second trigger)."""

    name = "other_step"


class LossAboveConfig(DiagnosisConfig):
    threshold: float = Field(10.0, description="Fire when the loss is above this.")


class LossAbove(Diagnosis):
    """Fires at each step whose loss is above the threshold (a spike)."""

    name = "loss_above"
    reads = ("loss",)
    source = "a test rule"
    Config = LossAboveConfig
    config: LossAboveConfig

    def check(self, window: Window) -> list[Finding]:
        steps, loss = window.series("loss")
        return [
            self.finding("", "warning", s, s, "loss spike", {"loss": v})
            for s, v in zip(steps.tolist(), loss.tolist())
            if v > self.config.threshold
        ]


class _Plugin:
    @hookimpl
    def register_diagnoses(self, register: Any) -> None:
        register(AtStep)
        register(OtherStep)
        register(LossAbove)


@pytest.fixture(scope="module")
def registry() -> Registry:
    registry = Registry.from_entry_points()
    info = registry.add_plugin(_Plugin(), name="trigger_tests")
    assert info.ok, info.error
    return registry


# -- training -----------------------------------------------------------------------------


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)
    ).double()


def _batch(step: int, spike_at: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (8,), generator=gen)
    if step == spike_at:
        x = 300.0 * x  # a loss spike
    return x, y


def _cockpit(registry: Registry, quantities: list[Any], **kwargs: Any) -> tuple[Cockpit, Any]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    cp = Cockpit(model, quantities, loss_fn=loss_fn, optimizer=opt, registry=registry, **kwargs)
    return cp, (model, opt, loss_fn)


def _train(
    cp: Cockpit, parts: Any, steps: range, spike_at: int | None = None
) -> list[warnings.WarningMessage]:
    model, opt, loss_fn = parts
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in steps:
            x, y = _batch(step, spike_at)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            with cp(step, loss=loss):
                loss.backward()
            opt.step()
    return list(caught)


def _steps_with(cp: Cockpit, key: str) -> list[int]:
    return [s for s, values in cp.get_output().items() if key in values]


def _on_finding(diagnosis: Any = "at_step", steps: int = 3, **more: Any) -> dict[str, Any]:
    return {"kind": "on_finding", "diagnosis": diagnosis, "steps": steps, **more}


def _not_unobserved(caught: list[warnings.WarningMessage]) -> None:
    """No warning that a forward pass ran while the providers or the observer were off."""
    messages = [str(w.message) for w in caught if issubclass(w.category, CockpitWarning)]
    assert not [m for m in messages if "did not observe" in m], messages


# -- the window ---------------------------------------------------------------------------


def test_recorded_on_exactly_the_steps_after_the_finding(registry, tmp_path):
    log = tmp_path / "log.jsonl"
    cp, parts = _cockpit(
        registry,
        ["loss", {"name": "grad_norm", "schedule": _on_finding(steps=3)}],
        diagnoses=[{"name": "at_step", "steps": [4]}],
        log=log,
    )
    caught = _train(cp, parts, range(12))
    cp.close()
    assert _steps_with(cp, "loss") == list(range(12))
    assert _steps_with(cp, "grad_norm") == [5, 6, 7]  # the finding's step ran already
    assert [f.id for f in cp.findings] == ["at_step@4"]
    assert cp._tracker.diagnoses is not None and cp._tracker.diagnoses.eager == {"at_step"}
    assert not cp.errors
    _not_unobserved(caught)
    records = list(read_records(log))
    logged = sorted(
        r["step"] for r in records if r["kind"] == "values" and "grad_norm" in r["values"]
    )
    assert logged == [5, 6, 7]  # ordinary values records
    finding = next(i for i, r in enumerate(records) if r["kind"] == "finding")
    first = next(
        i for i, r in enumerate(records) if r["kind"] == "values" and "grad_norm" in r["values"]
    )
    assert finding < first


def test_a_later_finding_restarts_the_window_and_also_keeps_a_baseline(registry):
    schedule = _on_finding(steps=3, also={"kind": "every", "every": 10})
    cp, parts = _cockpit(
        registry,
        ["loss", {"name": "grad_norm", "schedule": schedule}],
        diagnoses=[{"name": "at_step", "steps": [3, 5, 15]}],
    )
    _train(cp, parts, range(22))
    # 3 -> 4..6; 5 restarts -> 6..8 (merged: 4..8); 15 -> 16..18; also 0, 10, 20
    assert _steps_with(cp, "grad_norm") == [0, 4, 5, 6, 7, 8, 10, 16, 17, 18, 20]


def test_severity_and_several_diagnoses(registry):
    quantities = [
        "loss",
        {"name": "grad_norm", "schedule": _on_finding(steps=2)},  # warning or worse
        {"name": "distance", "schedule": _on_finding(steps=2, severity="info")},
        {"name": "loss", "label": "loss_2", "schedule": _on_finding(["at_step", "other_step"], 1)},
        {
            "name": "loss",
            "label": "loss_3",
            "schedule": _on_finding(["at_step", "other_step"], 1, severity="info"),
        },
    ]
    cp, parts = _cockpit(
        registry,
        quantities,
        diagnoses=[
            {"name": "at_step", "steps": [2], "severity": "info"},
            {"name": "other_step", "steps": [6], "severity": "error"},
        ],
    )
    _train(cp, parts, range(10))
    assert _steps_with(cp, "grad_norm") == []  # at_step: info; other_step is not followed
    assert _steps_with(cp, "distance") == [3, 4]
    assert _steps_with(cp, "loss_2") == [7]
    assert _steps_with(cp, "loss_3") == [3, 7]


def test_two_cockpits_keep_their_own_triggers(registry):
    quantities = ["loss", {"name": "grad_norm", "schedule": _on_finding(steps=2)}]
    a, parts_a = _cockpit(registry, quantities, diagnoses=[{"name": "at_step", "steps": [1]}])
    b, parts_b = _cockpit(registry, quantities, diagnoses=[{"name": "at_step", "steps": [5]}])
    for step in range(9):  # interleaved, in one process
        _train(a, parts_a, range(step, step + 1))
        _train(b, parts_b, range(step, step + 1))
    assert _steps_with(a, "grad_norm") == [2, 3]
    assert _steps_with(b, "grad_norm") == [6, 7]


def test_a_loss_spike_captures_the_per_sample_histogram_after_it(registry):
    schedule = _on_finding("loss_above", steps=2)
    cp, parts = _cockpit(
        registry,
        ["loss", {"name": "grad_hist_1d", "bins": 10, "schedule": schedule}],
        diagnoses=[{"name": "loss_above", "threshold": 20.0}],
    )
    caught = _train(cp, parts, range(10), spike_at=6)
    assert [f.first_step for f in cp.findings] == [6]
    assert _steps_with(cp, "grad_hist_1d") == [7, 8]
    assert not cp.errors
    _not_unobserved(caught)


# -- the values of triggered steps ---------------------------------------------------------------


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple, np.ndarray)):
        np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
    else:
        assert a == b


@pytest.mark.parametrize("name", ["grad_hist_1d", "norm_test"])
def test_per_sample_quantity_on_triggered_steps_equals_tracking_every_step(registry, name):
    """The providers are armed for the forward pass of the step after the finding."""
    triggered, parts = _cockpit(
        registry,
        ["loss", {"name": name, "schedule": _on_finding(steps=2)}],
        diagnoses=[{"name": "at_step", "steps": [3, 8]}],
    )
    every, parts_every = _cockpit(registry, ["loss", name])
    caught = _train(triggered, parts, range(12))
    caught += _train(every, parts_every, range(12))
    assert _steps_with(triggered, name) == [4, 5, 9, 10]
    assert not triggered.errors and not every.errors
    assert triggered._tracker.planner.schedule_state()["follow"]  # no step came unprepared
    _not_unobserved(caught)
    mine, reference = triggered.get_output(), every.get_output()
    for step in [4, 5, 9, 10]:
        _assert_same(mine[step][name], reference[step][name])
    for step in range(12):  # the models trained alike
        assert mine[step]["loss"] == pytest.approx(reference[step]["loss"], rel=1e-12)


# -- resuming --------------------------------------------------------------------------------------


def test_a_resumed_run_keeps_an_open_capture_window(registry, tmp_path):
    quantities = ["loss", {"name": "grad_hist_1d", "bins": 10, "schedule": _on_finding(steps=4)}]
    diagnoses = [{"name": "at_step", "steps": [4]}]
    cp, parts = _cockpit(registry, quantities, diagnoses=diagnoses)
    _train(cp, parts, range(6))  # finding at 4: window 5..8, open after step 5
    model, opt, _ = parts
    path = tmp_path / "ckpt.pt"
    torch.save(
        {"model": model.state_dict(), "opt": opt.state_dict(), "cockpit": cp.state_dict()}, path
    )
    saved = torch.load(path, weights_only=True)
    assert saved["cockpit"]["triggers"] == {"at_step": {"warning": 4}}

    resumed, parts2 = _cockpit(registry, quantities, diagnoses=diagnoses)
    parts2[0].load_state_dict(saved["model"])
    parts2[1].load_state_dict(saved["opt"])
    report = resumed.load_state_dict(saved["cockpit"])
    assert report.complete
    caught = _train(resumed, parts2, range(6, 12))
    assert _steps_with(resumed, "grad_hist_1d") == [6, 7, 8]
    assert not resumed.errors
    _not_unobserved(caught)

    older = dict(saved["cockpit"])
    del older["triggers"]  # a state saved before triggers existed: no open window
    fresh, parts3 = _cockpit(registry, quantities, diagnoses=diagnoses)
    fresh.load_state_dict(older)
    _train(fresh, parts3, range(6, 9))
    assert _steps_with(fresh, "grad_hist_1d") == []


# -- configuration ----------------------------------------------------------------------------


def test_a_config_file_declares_the_trigger(registry, tmp_path):
    path = tmp_path / "cockpit.toml"
    path.write_text(
        'diagnoses = [{ name = "at_step", steps = [2] }]\n'
        "quantities = [\n"
        '  "loss",\n'
        '  { name = "grad_norm", schedule = { kind = "on_finding", diagnosis = "at_step",'
        " steps = 2 } },\n"
        "]\n"
    )
    data = load_config_file(path)
    validated = validate_config_data(data, registry, str(path))
    assert isinstance(validated.quantities[1].config.schedule, OnFinding)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    cp = Cockpit.from_config(path, model, registry=registry, loss_fn=loss_fn, optimizer=opt)
    _train(cp, (model, opt, loss_fn), range(6))
    assert _steps_with(cp, "grad_norm") == [3, 4]
    assert cp.header()["quantities"][1]["schedule"]["diagnosis"] == "at_step"


@pytest.mark.parametrize(
    "schedule, path, message",
    [
        ({"steps": 0}, "quantities.1.schedule.steps", "greater than or equal to 1"),
        ({"steps": True}, "quantities.1.schedule.steps", "got bool True"),
        ({"severity": "fatal"}, "quantities.1.schedule.severity", "'info', 'warning' or 'error'"),
        ({"stepz": 3}, "quantities.1.schedule.stepz", "unknown option"),
        ({"diagnosis": []}, "quantities.1.schedule.diagnosis", "name at least one diagnosis"),
        ({"diagnosis": 3}, "quantities.1.schedule.diagnosis", "got int 3"),
        (
            {"also": {"kind": "on_finding", "diagnosis": "at_step"}},
            "quantities.1.schedule.also",
            "'every', 'log', 'steps'",
        ),
    ],
)
def test_bad_fields_are_config_errors_with_their_path(registry, schedule, path, message):
    data = {
        "diagnoses": ["at_step"],
        "quantities": ["loss", {"name": "grad_norm", "schedule": {**_on_finding(), **schedule}}],
    }
    with pytest.raises(ConfigError) as err:
        validate_config_data(data, registry, "cockpit.toml")
    assert [p for p, _ in err.value.errors] == [path]
    assert message in err.value.errors[0][1]


def test_an_unknown_diagnosis_names_the_installed_ones(registry):
    spec = [{"name": "grad_norm", "schedule": _on_finding("at_stepp")}]
    with pytest.raises(ConfigError) as err:
        resolve_quantities(spec, registry)
    ((path, message),) = err.value.errors
    assert path == "quantities.0.schedule.diagnosis"
    assert "Unknown diagnosis 'at_stepp'. Did you mean 'at_step'?" in message
    assert "Installed:" in message and "loss_above" in message


def test_a_diagnosis_that_does_not_run_is_an_error_saying_how_to_enable_it(registry):
    entry = {"name": "grad_norm", "schedule": _on_finding("loss_above")}
    with pytest.raises(ConfigError) as err:
        validate_config_data({"quantities": ["loss", entry]}, registry)
    ((path, message),) = err.value.errors
    assert path == "quantities.1.schedule.diagnosis"
    assert "'loss_above' does not run while training" in message
    assert 'diagnoses = ["loss_above"]' in message
    model = _model()
    with pytest.raises(ConfigError, match=r'Cockpit\(\.\.\., diagnoses=\["loss_above"\]\)'):
        Cockpit(model, ["loss", entry], registry=registry, diagnoses=["at_step"])
    with pytest.raises(ConfigError, match="running: none"):
        Cockpit(model, ["loss", entry], registry=registry)


def test_cp_add_binds_the_schedule_or_adds_nothing(registry):
    cp, parts = _cockpit(registry, ["loss"], diagnoses=[{"name": "at_step", "steps": [3]}])
    _train(cp, parts, range(2))
    with pytest.raises(ConfigError) as err:
        cp.add({"name": "grad_norm", "schedule": _on_finding("loss_above")})
    assert err.value.errors[0][0] == "quantity.schedule.diagnosis"
    assert [q.key for q in cp.quantities] == ["loss"]
    with pytest.raises(ConfigError, match="Unknown diagnosis 'nope'"):
        cp.add({"name": "grad_norm", "schedule": _on_finding("nope")})
    cp.add({"name": "grad_hist_1d", "bins": 10, "schedule": _on_finding(steps=2)})
    caught = _train(cp, parts, range(2, 8))
    assert _steps_with(cp, "grad_hist_1d") == [4, 5]
    assert not cp.errors
    _not_unobserved(caught)


def test_one_instance_in_two_open_cockpits_is_refused(registry):
    from cockpit_basic import GradNorm

    q = GradNorm(schedule=OnFinding(diagnosis="at_step"))
    a = Cockpit(_model(), ["loss", q], registry=registry, diagnoses=["at_step"])
    with pytest.raises(MisuseError, match="tracked by another Cockpit"):
        Cockpit(_model(), ["loss", q], registry=registry, diagnoses=["at_step"])
    a.close()
    b = Cockpit(_model(), ["loss", q], registry=registry, diagnoses=["at_step"])
    assert q.schedule.triggers is b._tracker.triggers
    b.close()


def test_the_schedule_model_alone_cannot_be_evaluated():
    with pytest.raises(MisuseError, match="only a Cockpit evaluates it"):
        OnFinding(diagnosis="loss_spike")(3)


# -- the trigger table and the runner -------------------------------------------------------------


def _finding(diagnosis: str, severity: str, step: int) -> Finding:
    return Finding(f"{diagnosis}@{step}", diagnosis, severity, step, step, "m")


def test_the_trigger_table():
    triggers = Triggers()
    warn = OnFinding(diagnosis="a", steps=2)
    info = OnFinding(diagnosis=["a", "b"], steps=2, severity="info")
    assert not any(triggers.active(warn, s) for s in range(10))
    triggers.fired(_finding("a", "info", 3), 3)  # asked about later steps, as the planner asks
    assert [s for s in range(10) if triggers.active(info, s)] == [4, 5]
    assert not any(triggers.active(warn, s) for s in range(10))
    triggers.fired(_finding("b", "error", 4), 4)  # restarts: 5..6
    assert [s for s in range(5, 10) if triggers.active(info, s)] == [5, 6]
    assert not any(triggers.active(warn, s) for s in range(5, 10))  # b: not followed
    triggers.fired(_finding("a", "error", 6), 6)
    assert [s for s in range(7, 10) if triggers.active(info, s)] == [7, 8]
    assert [s for s in range(7, 10) if triggers.active(warn, s)] == [7, 8]
    copy = Triggers()
    copy.load_state_dict(triggers.state_dict())
    assert copy.state_dict() == {"a": {"info": 3, "error": 6}, "b": {"error": 4}}


def test_followed_diagnoses_are_checked_at_every_step_the_others_at_their_pace():
    steps = list(range(3 * CHECKS_PER_WINDOW + 1))

    def arrivals(eager: bool) -> dict[str, list[int]]:
        runner = DiagnosisRunner([AtStep(steps=[steps[-1]]), OtherStep(steps=[steps[-1]])])
        if eager:
            runner.check_every_step(["at_step"])
        seen: dict[str, list[int]] = {}
        for s in steps:
            for f in runner.observe({"kind": "values", "step": s, "values": {"loss": 1.0}}):
                seen.setdefault(f.diagnosis, []).append(s)
        return seen

    last = steps[-1]
    assert arrivals(eager=False) == {}  # not due at the last step: 3 new steps are needed
    assert arrivals(eager=True) == {"at_step": [last]}
