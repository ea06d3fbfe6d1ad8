"""``SystemExit`` from plugin code (sinks, providers, instruments) never ends the run."""

from __future__ import annotations

import contextlib

import pytest
from cockpit_dashboard import render

from cockpit_core import Cockpit, CockpitWarning
from cockpit_core.log import LogData, read_records
from cockpit_core.panel import Instrument
from cockpit_core.testing import run_cockpit, tiny_mlp


class ExitingSink:
    """Keeps the records it gets; raises ``SystemExit(2)`` on ``fail_on`` ("write", "close")."""

    def __init__(self, fail_on: str | None = None):
        self.fail_on, self.records, self.closed = fail_on, [], False

    def __call__(self, record: dict) -> None:
        if self.fail_on == "write" and record["kind"] == "values":
            raise SystemExit(2)
        self.records.append(record)

    def close(self) -> None:
        if self.fail_on == "close":
            raise SystemExit(2)
        self.closed = True


def _steps(records: list[dict]) -> list[tuple[str, int | None]]:
    return [(r["kind"], r.get("step")) for r in records]


KINDS = ("values", "cost")  # a step's values, then its cost record (when the next enters)


def test_a_sink_exiting_on_write_is_removed_and_the_log_keeps_every_record(tmp_path):
    log = tmp_path / "log.jsonl"
    exiting, other = ExitingSink("write"), ExitingSink()
    with pytest.warns(
        CockpitWarning, match=r"cockpit: sink .* failed and was removed: 2 \(SystemExit\)"
    ):
        result = run_cockpit(tiny_mlp(), ["loss"], steps=3, log=log, sinks=[exiting, other])
    result.cockpit.close()
    assert exiting not in result.cockpit.sinks and other.closed
    logged = read_records(log)
    assert _steps(logged) == [("header", None)] + [(k, s) for s in range(3) for k in KINDS]
    assert _steps(other.records) == _steps(logged)
    losses = [r["values"]["loss"] for r in logged if r["kind"] == "values"]
    assert losses == pytest.approx([s.loss for s in result.snapshots], rel=1e-6)


def test_a_sink_exiting_on_close_does_not_skip_the_others(tmp_path):
    log = tmp_path / "log.jsonl"
    exiting, other = ExitingSink("close"), ExitingSink()
    result = run_cockpit(tiny_mlp(), ["loss"], steps=2, log=log, sinks=[exiting, other])
    with pytest.warns(CockpitWarning, match=r"cockpit: closing sink .* failed: 2 \(SystemExit\)"):
        result.cockpit.close()
    assert other.closed and _steps(exiting.records) == _steps(other.records)
    assert _steps(read_records(log)) == [("header", None)] + [(k, s) for s in (0, 1) for k in KINDS]


@pytest.mark.parametrize("when", ["setup", "after backward"])
def test_a_provider_exiting_loses_only_its_statistics(monkeypatch, when):
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["grad_norm", "norm_test"], on_error="warn")
    provider = cp._router.providers["backpack"]

    @contextlib.contextmanager
    def exiting(collection):  # computes nothing
        if when == "setup":
            raise SystemExit(3)
        yield
        raise SystemExit(3)

    monkeypatch.setattr(provider, "collect", exiting)
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with pytest.warns(CockpitWarning, match="provider 'backpack' raised SystemExit: 3"):
        with cp(0, info={"loss": loss, "batch_size": len(x)}):
            loss.backward()
    out = cp.get_output()[0]
    assert out["grad_norm"]["total"] == pytest.approx(
        float(sum(p.grad.pow(2).sum() for p in model.parameters()) ** 0.5), rel=1e-6
    )
    (error,) = cp.errors
    assert error["quantity"] == "norm_test" and "norm_test" not in out
    assert "provider 'backpack' raised SystemExit: 3" in error["error"]


def _exit(*args) -> None:
    raise SystemExit(4)


def _draw(ax, output, header) -> None:
    ax.plot(sorted(output), [output[s]["wiggle"] for s in sorted(output)])


def test_an_instrument_exiting_does_not_break_the_dashboard():
    exiting = Instrument("exiting", "Exiting panel", "gradient", ("wiggle",), _exit)
    hidden = Instrument("hidden", "Hidden panel", "gradient", ("wiggle",), _draw, available=_exit)
    fine = Instrument("fine", "Fine panel", "gradient", ("wiggle",), _draw)
    data = LogData({}, {0: {"wiggle": 1.0}, 1: {"wiggle": 2.0}})
    with pytest.warns(UserWarning, match="instrument 'exiting' failed: SystemExit: 4"):
        fig = render(data, instruments=[exiting, hidden, fine])
    axes = {ax.get_title(loc="left"): ax for ax in fig.axes}
    assert "Hidden panel" not in axes  # a check that raises hides its panel
    assert axes["Exiting panel"].texts[0].get_text() == "could not draw this panel:\nSystemExit: 4"
    assert list(axes["Fine panel"].lines[0].get_ydata()) == [1.0, 2.0]


def test_a_provider_exiting_on_arm_or_close_is_reported_and_training_goes_on(monkeypatch):
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model, ["grad_norm", "norm_test"], on_error="warn")
    provider = cp._router.providers["hooks"]
    monkeypatch.setattr(provider, "arm", _exit)
    loss_fn = problem.loss_module()
    with pytest.warns(CockpitWarning, match="provider 'hooks' failed to arm: SystemExit: 4"):
        for step in range(2):
            x, y = problem.batch(step)
            model.zero_grad()
            loss = loss_fn(model(x), y)
            with cp(step, info={"loss": loss, "batch_size": len(x)}):
                loss.backward()
    out = cp.get_output()
    assert sorted(out) == [0, 1] and all("grad_norm" in out[step] for step in (0, 1))
    monkeypatch.setattr(provider, "close", _exit)
    with pytest.warns(CockpitWarning, match="provider 'hooks' failed to close: SystemExit: 4"):
        cp.close()
