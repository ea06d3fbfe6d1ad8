"""Resuming a run from a checkpoint: ``cp.state_dict()`` / ``cp.load_state_dict(state)``.

A run of 10 steps saves the model, the optimizer and the Cockpit with ``torch.save``; a new
process loads them with ``torch.load(weights_only=True)``, builds a new Cockpit on the same
log, loads its state and trains 10 more steps. Every quantity of the resumed steps (and the
two-step values of the boundary step) equals an uninterrupted run of 20 steps, and the log
reads back as one continuous run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from cockpit_core import Cockpit, MisuseError, StateError
from cockpit_core.log import read_run
from cockpit_core.testing import tiny_mlp

QUANTITIES = [
    "economy",  # loss, grad_norm, distance, update_size, alpha, grad_hist_1d, tests, ...
    "hess_max_ev",
    {"name": "grad_hist_1d", "label": "hist_adapt", "adapt": "grad_abs_max", "bins": 20},
]
STEPS, SAVED_AT = 20, 10

WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    from cockpit_core import Cockpit
    from cockpit_core.testing import tiny_mlp

    checkpoint, log, out, quantities, first, last = sys.argv[1:7]
    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saved = torch.load(checkpoint, weights_only=True)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    cp = Cockpit(model, json.loads(quantities), loss_fn=loss_fn, optimizer=opt, log=log)
    report = cp.load_state_dict(saved["cockpit"])
    assert report.complete, report
    for step in range(int(first), int(last)):
        x, y = problem.batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
    cp.close()
    cp.write(out)
    json.dump({"errors": cp.errors, "skipped": cp.skipped}, open(out + ".errors", "w"))
    """
)


def train(cp, model, opt, loss_fn, problem, steps):
    for step in steps:
        x, y = problem.batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, loss=loss):
            loss.backward()
        opt.step()


def build(log=None):
    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cp = Cockpit(model, QUANTITIES, loss_fn=loss_fn, optimizer=opt, log=log)
    return cp, model, opt, loss_fn, problem


def assert_close(a, b, path, rtol=1e-9):
    """Nested dicts/lists/arrays/numbers equal to float64 round-off (NaN equals NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: {a.keys()} != {b.keys()}"
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}", rtol)
    elif isinstance(a, (list, tuple)) and not all(isinstance(v, (int, float)) for v in a):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]", rtol)
    elif a is None or isinstance(a, (str, bool)):
        assert a == b, path
    else:
        np.testing.assert_allclose(
            np.asarray(a, float), np.asarray(b, float), rtol=rtol, atol=1e-14, err_msg=path
        )


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """The uninterrupted run's output, and the log and output of the interrupted one."""
    tmp = tmp_path_factory.mktemp("resume")
    reference, *rest = build()
    train(reference, *rest, range(STEPS))
    reference.close()
    reference_out = read_run(reference.write(tmp / "reference.json")).output

    log = tmp / "log.jsonl"
    cp, model, opt, loss_fn, problem = build(log)
    train(cp, model, opt, loss_fn, problem, range(SAVED_AT))
    checkpoint = tmp / "checkpoint.pt"
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "cockpit": cp.state_dict()},
        checkpoint,
    )
    cp.close()  # the process "stops" here
    script = tmp / "resume_worker.py"
    script.write_text(WORKER)
    out = tmp / "resumed.json"
    args = [str(checkpoint), str(log), str(out), json.dumps(QUANTITIES), str(SAVED_AT)]
    done = subprocess.run(
        [sys.executable, str(script), *args, str(STEPS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {
        "reference": reference_out,
        "log": read_run(log),
        "resumed": read_run(out).output,
        "errors": json.loads(Path(str(out) + ".errors").read_text()),
    }


def test_every_quantity_of_the_resumed_steps_equals_the_uninterrupted_run(resumed):
    reference, out = resumed["reference"], resumed["resumed"]
    assert resumed["errors"] == {"errors": [], "skipped": []}
    assert sorted(out) == list(range(SAVED_AT - 1, STEPS))  # step 9: its two-step values
    assert set(out[SAVED_AT - 1]) == {"alpha", "update_size"}  # ended in the new process
    for step in range(SAVED_AT - 1, STEPS):
        for key, value in out[step].items():
            expected = reference[step][key]
            if key == "hess_max_ev":  # the warm start continues: the same products
                assert value["hvps"] == expected["hvps"], step
                assert value["value"] == pytest.approx(expected["value"], rel=1e-4)
                continue
            assert_close(value, expected, f"step {step}: {key}")
    boundary = out[SAVED_AT]
    assert boundary["distance"]["total"] > out[SAVED_AT - 1]["update_size"]["total"] > 0
    assert out[SAVED_AT - 1]["alpha"]["predictor"] == "sgd"  # the optimizer's update
    assert boundary["alpha"]["predictor"] == "sgd"
    assert out[SAVED_AT]["hist_adapt"]["edges"][-1] != 2.0  # the adapted range continues


def test_the_log_reads_back_as_one_continuous_run(resumed):
    data, reference = resumed["log"], resumed["reference"]
    assert sorted(data.output) == list(range(STEPS))
    for step in range(STEPS):
        assert data.output[step].keys() == reference[step].keys(), step
        for key, value in data.output[step].items():
            if key != "hess_max_ev":
                assert_close(value, reference[step][key], f"log step {step}: {key}")
    assert data.resumed == [{"step": SAVED_AT - 1, "from_run": 1}]
    assert [h["run"] for h in data.headers] == [1, 2]
    assert data.errors == [] and data.skipped == []


def test_the_state_loads_with_weights_only_and_holds_plain_data(tmp_path):
    cp, *rest = build()
    train(cp, *rest, range(3))
    path = tmp_path / "state.pt"
    torch.save(cp.state_dict(), path)
    state = torch.load(path, weights_only=True)

    def kinds(value):
        if isinstance(value, dict):
            return set().union(set(), *(kinds(v) for v in value.values()))
        if isinstance(value, (list, tuple)):
            return set().union(set(), *(kinds(v) for v in value))
        return {type(value).__name__}

    assert kinds(state) <= {"Tensor", "int", "float", "str", "bool", "NoneType"}
    entries = {q["key"]: q for q in state["quantities"]}
    assert list(entries["distance"]["cache"]) == ["initial_params"]
    assert entries["update_size"]["start"]["step"] == 2
    assert entries["alpha"]["start"]["step"] == 2
    assert entries["hess_max_ev"]["cache"]["eigenvectors"]["expires"] == 3
    assert state["step"] == 2 and state["schedule"] == {"last": 2, "stride": 1, "follow": True}


def test_a_state_that_does_not_fit_is_refused_or_partly_loaded(tmp_path):
    cp, *rest = build()
    train(cp, *rest, range(2))
    state = cp.state_dict()
    problem = tiny_mlp()
    other = Cockpit(problem.make_model(), ["loss", {"name": "hess_max_ev", "k": 2}, "time"])
    with pytest.raises(StateError) as err:
        other.load_state_dict(state)
    message = str(err.value)
    assert "tracked now but not saved: ['time']" in message
    assert "'hess_max_ev': saved with {'name': 'hess_max_ev', 'key': 'hess_max_ev'}" in message
    assert "saved but not tracked now: ['alpha'" in message and "strict=False" in message
    assert other.state_dict()["step"] is None  # a refused state changes nothing
    report = other.load_state_dict(state, strict=False)
    assert report.missing == ["time"] and "hess_max_ev" in report.mismatched
    assert "distance" in report.unexpected
    assert other.state_dict()["step"] == 1  # the rest continues: the next step is 2
    with pytest.raises(MisuseError, match="before the resumed run's first step"):
        other.load_state_dict(state)
    with pytest.raises(StateError, match="not a Cockpit state"):
        Cockpit(problem.make_model(), ["loss"]).load_state_dict({"model": {}})


def test_state_dict_is_refused_inside_a_step_block():
    cp, model, opt, loss_fn, problem = build()
    x, y = problem.batch(0)
    loss = loss_fn(model(x), y)
    with cp(0, loss=loss):
        loss.backward()
        with pytest.raises(MisuseError, match="between steps"):
            cp.state_dict()
