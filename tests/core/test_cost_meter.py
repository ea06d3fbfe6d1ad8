"""Cockpit measures its own cost: one ``cost`` record per tracked step (cockpit_core.engine.cost)."""

import itertools

import pytest
import torch

from cockpit_core import Cockpit
from cockpit_core.engine.cost import CostMeter
from cockpit_core.log import LogData, read_records, read_run

pytestmark = pytest.mark.filterwarnings("ignore::cockpit_core.errors.CockpitWarning")


def scripted(readings):
    """A clock returning ``readings`` in order (fails the test if read once too often)."""
    it = iter(readings)
    return lambda: next(it)


def test_fields_over_tracked_and_untracked_steps_with_a_fake_clock():
    out = []
    # the meter reads the clock at the end of __enter__ and of __exit__ only
    meter = CostMeter(out.append, clock=scripted([1, 5, 10.5, 13.5, 20.5, 25, 33, 42, 50.5, 54]))
    meter.entered(0, 0.0, tracked=True)
    meter.quantity("a", 0.5)
    meter.exited(4.0)
    meter.entered(1, 10.0, tracked=False)  # ends step 0's iteration: its record
    assert out == [
        {
            "kind": "cost",
            "step": 0,
            "block_s": 5.0,
            "cockpit_s": 2.0,  # (1 - 0) + (5 - 4)
            "iteration_s": 10.0,
            "plain_block_s": None,
            "plain_iteration_s": None,
            "untracked_before": 0,
            "quantities_s": {"a": 0.5},
        }
    ]
    meter.exited(13.0)  # block 3.5
    meter.entered(2, 20.0, tracked=False)  # step 1's iteration: 10
    meter.exited(24.5)  # block 5
    assert meter.plain_block_s == 4.25 and meter.plain_iteration_s == 10.0
    meter.entered(3, 32.0, tracked=True)  # step 2's iteration: 12
    for key, seconds in [("a", 1.0), ("b", 2.0), ("a", 0.25)]:
        meter.quantity(key, seconds)
    meter.exited(40.0)
    meter.entered(4, 50.0, tracked=False)
    assert out[1] == {
        "kind": "cost",
        "step": 3,
        "block_s": 10.0,  # 42 - 32
        "cockpit_s": 3.0,  # (33 - 32) + (42 - 40)
        "iteration_s": 18.0,
        "plain_block_s": 4.25,  # median of 3.5 and 5
        "plain_iteration_s": 11.0,  # median of 10 and 12
        "untracked_before": 2,
        "quantities_s": {"a": 1.25, "b": 2.0},
    }
    meter.exited(53.0)
    meter.close()  # the last step is untracked: nothing more
    assert len(out) == 2 and meter.plain_block_s == 4.0  # median of 3.5, 5, 4


def test_the_last_tracked_step_is_written_at_close_and_a_raising_block_is_forgotten():
    out = []
    meter = CostMeter(out.append, clock=scripted([1, 3, 11, 21, 24]), keep=2)
    meter.entered(0, 0.0, tracked=False)
    meter.exited(2.0)
    meter.entered(1, 10.0, tracked=True)
    meter.discard()  # the block raised: neither tracked nor plain
    meter.entered(2, 20.0, tracked=True)
    meter.exited(22.0)
    meter.close()
    meter.close()  # twice: nothing more
    assert out == [
        {
            "kind": "cost",
            "step": 2,
            "block_s": 4.0,
            "cockpit_s": 3.0,  # (21 - 20) + (24 - 22)
            "iteration_s": None,
            "plain_block_s": 3.0,
            "plain_iteration_s": 10.0,  # step 0 ran until step 1 entered
            "untracked_before": 1,
            "quantities_s": {},
        }
    ]


def test_plain_medians_use_the_latest_untracked_steps_only():
    readings = [1, 3, 11, 14, 31, 35, 61, 66, 101, 107]  # ends of __enter__ and __exit__
    meter = CostMeter(lambda r: None, clock=scripted(readings), keep=3)
    for step, started in enumerate([0, 10, 30, 60, 100]):
        meter.entered(step, float(started), tracked=False)
        meter.exited(float(started + 2))
    # blocks 3, 4, 5, 6, 7 and iterations 10, 20, 30, 40: the last three of each
    assert meter.plain_block_s == 6.0 and meter.plain_iteration_s == 30.0


def train(steps, quantities, log=None, sinks=(), fail_at=None):
    """A tiny MLP trained with SGD; the block of ``fail_at`` raises (and is caught)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    cp = Cockpit(model, quantities, log=log, sinks=list(sinks))
    for step in range(steps):
        opt.zero_grad()
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        loss = losses.mean()
        info = {"loss": loss, "individual_losses": losses.detach(), "batch_size": 32}
        try:
            with cp(step, info=info):
                loss.backward()
                if step == fail_at:
                    raise ValueError("user code failed")
        except ValueError:
            continue
        opt.step()
    return cp


QUANTITIES = [{"name": "loss", "every": 3}, {"name": "grad_norm", "every": 5}]
TRACKED = {0: 0, 3: 2, 5: 1, 6: 0, 9: 2, 10: 0, 12: 1}  # step -> untracked blocks before


def due_at(step):
    """The quantities of :data:`QUANTITIES` computed at ``step``."""
    loss = {"loss"} if step % 3 == 0 else set()
    return loss | ({"grad_norm"} if step % 5 == 0 else set())


def test_a_training_loop_logs_one_cost_record_per_tracked_step(tmp_path):
    log = tmp_path / "log.jsonl"
    seen = []
    cp = train(13, QUANTITIES, log=log, sinks=[seen.append])
    output = cp.get_output()
    cp.close()
    records = [r for r in read_records(log) if r["kind"] == "cost"]
    assert [r["step"] for r in records] == list(TRACKED)
    assert {r["step"]: r["untracked_before"] for r in records} == TRACKED
    for r in records:
        assert 0 <= r["cockpit_s"] <= r["block_s"]
        assert r["iteration_s"] is None or r["iteration_s"] >= r["block_s"]
        assert set(r["quantities_s"]) == due_at(r["step"])
        assert all(s >= 0 for s in r["quantities_s"].values())
    assert records[0]["plain_block_s"] is None and records[0]["plain_iteration_s"] is None
    assert all(r["plain_block_s"] > 0 and r["plain_iteration_s"] > 0 for r in records[1:])
    assert [r["iteration_s"] is None for r in records] == [False] * 6 + [True]  # 12 at close
    # the sinks get the same records; values and get_output() know nothing of them
    assert [r for r in seen if r["kind"] == "cost"] == records
    keys = {s: sorted(v) for s, v in output.items()}
    assert keys == {s: sorted(k for k in ("grad_norm", "loss") if k in due_at(s)) for s in TRACKED}
    assert {s: sorted(v) for s, v in read_run(log).output.items()} == keys
    assert read_run(log).cost == records
    folded = LogData()
    for r in seen:
        folded.add(r)
    assert folded.cost == records and {s: sorted(v) for s, v in folded.output.items()} == keys


def test_the_meter_reads_the_clock_at_the_edges_of_enter_and_exit():
    cp = Cockpit(torch.nn.Linear(2, 1), ["loss"])
    seen = []
    cp.sinks.append(seen.append)
    cp._tracker.cost.clock = itertools.count().__next__  # 0, 1, 2, ...: 4 reads per step
    model, x = cp.params[0], torch.randn(3, 2)
    for step in range(3):
        loss = (x @ model.T).pow(2).mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    cp.close()
    costs = [r for r in seen if r["kind"] == "cost"]
    assert [(r["block_s"], r["cockpit_s"], r["iteration_s"]) for r in costs] == [
        (3, 2, 4),
        (3, 2, 4),
        (3, 2, None),
    ]


def test_a_block_that_raises_has_no_cost_record(tmp_path):
    log = tmp_path / "log.jsonl"
    train(7, ["loss"], log=log, fail_at=3).close()
    steps = [r["step"] for r in read_records(log) if r["kind"] == "cost"]
    assert steps == [0, 1, 2, 4, 5, 6]


def test_a_later_run_replaces_the_cost_records_of_the_steps_it_records_again(tmp_path):
    log = tmp_path / "log.jsonl"
    train(4, ["loss"], log=log).close()
    train(2, ["loss"], log=log).close()  # a restart from step 0, appended as run 2
    data = read_run(log)
    assert [r["step"] for r in data.cost] == [2, 3, 0, 1]
    with open(log) as fh:
        assert sum('"kind":"cost"' in line for line in fh) == 6
