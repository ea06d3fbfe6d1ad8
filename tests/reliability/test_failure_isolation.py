"""A failing quantity never stops training; its errors are recorded with step and traceback."""

import warnings

import pytest
import torch

from cockpit_core import CockpitWarning, Quantity
from cockpit_core.log import read_records
from cockpit_core.testing import run_cockpit, tiny_mlp


class Failing(Quantity):
    """Raises the exception given at construction at every step from ``fail_from`` on."""

    name = "failing"

    def __init__(self, exc, fail_from=0, **kw):
        super().__init__(**kw)
        self.exc, self.fail_from = exc, fail_from

    def compute(self, ctx):
        if ctx.step >= self.fail_from:
            raise self.exc
        return 1.0


@pytest.mark.parametrize(
    "exc",
    [
        ZeroDivisionError("bug"),
        RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"),
        torch.OutOfMemoryError("CPU out of memory: tried to allocate 8.00 GiB"),
    ],
    ids=["bug", "shape", "oom"],
)
def test_failing_quantity_is_logged_and_others_keep_producing_values(tmp_path, exc):
    log = tmp_path / "log.jsonl"
    with pytest.warns(CockpitWarning) as record:
        result = run_cockpit(tiny_mlp(), [Failing(exc), "loss", "grad_norm"], steps=4, log=log)
    result.cockpit.close()
    record = [w for w in record if w.category is CockpitWarning]
    message = str(record[0].message)
    assert f"quantity 'failing' failed at step 0 ({type(exc).__name__}: {exc})" in message
    assert "training continues and it keeps being tracked" in message
    assert len(record) == 1  # one warning per quantity and error type, not one per step
    assert all({"loss", "grad_norm"} == set(result.output[s]) for s in range(4))
    errors = [r for r in read_records(log) if r["kind"] == "error"]
    assert [e["step"] for e in errors] == [0, 1, 2, 3]
    assert errors[0]["quantity"] == "failing" and errors[0]["error"].startswith(type(exc).__name__)
    assert any("compute" in frame for frame in errors[0]["traceback"])


def test_disable_policy_stops_tracking_after_the_first_error():
    with pytest.warns(CockpitWarning, match="it is disabled for the rest of the run"):
        result = run_cockpit(
            tiny_mlp(), [Failing(ValueError("x"), fail_from=1), "loss"], steps=4, on_error="disable"
        )
    assert result.output[0]["failing"] == 1.0
    assert [e["step"] for e in result.cockpit.errors] == [1]
    assert all("failing" not in result.output[s] for s in (1, 2, 3))


def test_raise_policy_reraises_the_original_exception():
    with pytest.raises(ValueError, match="x"):
        run_cockpit(tiny_mlp(), [Failing(ValueError("x"))], steps=1, on_error="raise")


def test_a_failing_sink_is_removed_and_training_goes_on():
    def bad_sink(record):
        raise OSError("disk full")

    problem = tiny_mlp()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from cockpit_core import Cockpit

        model = problem.make_model()
        cp = Cockpit(model.parameters(), ["loss"])
        cp.sinks.append(bad_sink)
        x, y = problem.batch(0)
        loss = problem.loss_module()(model(x), y)
        with cp(0, info={"loss": loss}):
            loss.backward()
    assert any("failed and was removed: disk full" in str(w.message) for w in caught)
    assert cp.get_output()[0]["loss"] == pytest.approx(float(loss.detach()))


def _raising_schedule(step):
    if step == 2:
        raise ValueError("schedule bug")
    return True


def test_a_raising_schedule_records_an_error_and_training_goes_on():
    from cockpit_core import Cockpit

    problem = tiny_mlp()
    model = problem.make_model()
    quantities = [{"name": "grad_norm"}, "loss"]
    cp = Cockpit(model.named_parameters(), quantities)
    cp.quantities[0].schedule = _raising_schedule
    loss_fn = problem.loss_module()
    with pytest.warns(
        CockpitWarning,
        match=r"quantity 'grad_norm' failed at step 2 \(its schedule raised ValueError: "
        r"schedule bug\); training continues and it keeps being tracked",
    ):
        for step in range(4):
            x, y = problem.batch(step)
            loss = loss_fn(model(x), y)
            with cp(step, info={"loss": loss}):
                loss.backward(retain_graph=cp.retain_graph(step))
            model.zero_grad()
    out = cp.get_output()
    assert [("grad_norm" in out[s]) for s in range(4)] == [True, True, False, True]
    assert all("loss" in out[s] for s in range(4))
    (error,) = cp.errors
    assert error["phase"] == "schedule" and error["step"] == 2 and error["quantity"] == "grad_norm"


def test_a_raising_schedule_with_on_error_raise_stops_the_run():
    from cockpit_core import Cockpit

    model = torch.nn.Linear(2, 1)
    cp = Cockpit(model.parameters(), ["grad_norm"], on_error="raise")
    cp.quantities[0].schedule = _raising_schedule
    with pytest.raises(ValueError, match="schedule bug"):
        cp.retain_graph(2)


class BrokenRequirements(Failing):
    """Its ``requirements()`` raise once ``broken`` is set (after the Cockpit was built)."""

    broken = False

    def requirements(self):
        if self.broken:
            raise RuntimeError("requirements bug")
        return super().requirements()


def test_raising_requirements_at_a_step_are_recorded():
    from cockpit_core import Cockpit

    problem = tiny_mlp()
    model = problem.make_model()
    broken = BrokenRequirements(None)
    cp = Cockpit(model.named_parameters(), [broken, "loss"])
    broken.broken = True
    loss_fn = problem.loss_module()
    with pytest.warns(CockpitWarning, match=r"its requirements\(\) raised RuntimeError"):
        for step in range(2):
            x, y = problem.batch(step)
            loss = loss_fn(model(x), y)
            with cp(step, info={"loss": loss}):
                loss.backward()
            model.zero_grad()
    assert [e["phase"] for e in cp.errors] == ["requirements", "requirements"]
    assert all("loss" in cp.get_output()[s] for s in range(2))


def test_system_exit_from_a_quantity_does_not_end_the_run():
    with pytest.warns(
        CockpitWarning, match=r"quantity 'failing' failed at step 0 \(SystemExit: 3\)"
    ):
        result = run_cockpit(tiny_mlp(), [Failing(SystemExit(3)), "loss"], steps=3)
    assert [e["error"] for e in result.cockpit.errors] == ["SystemExit: 3"] * 3
    assert all("loss" in result.output[s] for s in range(3))


def test_system_exit_is_reraised_with_on_error_raise():
    with pytest.raises(SystemExit):
        run_cockpit(tiny_mlp(), [Failing(SystemExit(3))], steps=1, on_error="raise")


def test_keyboard_interrupt_is_never_contained():
    with pytest.raises(KeyboardInterrupt):
        run_cockpit(tiny_mlp(), [Failing(KeyboardInterrupt())], steps=1)
