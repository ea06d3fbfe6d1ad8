"""cost: cockpit's own overhead above the user's budget, with the schedule that would meet it."""

import json
import math

import pytest
import torch
from cockpit_diagnoses import Cost
from cockpit_diagnoses.cost import estimate

from cockpit_core.cli.main import main
from cockpit_core.diagnosing.run import diagnose, exit_code
from cockpit_core.diagnosing.runner import DiagnosisRunner
from cockpit_core.diagnosis import Window
from cockpit_core.log import read_records, read_run


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: fewer stalls when other processes share the CPUs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def record(step, block, untracked=1, plain=(0.125, 0.25), cockpit=0.0, iteration=None, **spent):
    """A ``cost`` record as cockpit writes it."""
    return {
        "kind": "cost",
        "step": step,
        "block_s": block,
        "cockpit_s": cockpit,
        "iteration_s": iteration,
        "plain_block_s": plain[0],
        "plain_iteration_s": plain[1],
        "untracked_before": untracked,
        "quantities_s": spent,
    }


SPENT = {"hess_max_ev": 0.5, "grad_norm": 0.25, "loss": 0.125, "alpha": 0.125}


def measured_window():
    """Six tracked steps, every second step tracked after the first (untracked: 5)."""
    blocks = [0.625, 0.75, 0.875, 0.625, 0.75, 1.125]  # block - plain block 0.125:
    # 0.5, 0.625, 0.75, 0.5, 0.625, 1.0 (one group of steps): median 0.625
    untracked = [0, 1, 1, 1, 1, 1]
    return Window(
        {},
        cost=[record(2 * i, b, u, **SPENT) for i, (b, u) in enumerate(zip(blocks, untracked))],
    )


def test_the_overhead_and_the_schedule_that_meets_the_budget():
    (f,) = Cost(min_records=6).check(measured_window())
    ev = f.evidence
    # tracked fraction 6 / (6 + 5); overhead 0.625 * 6 / 11 / 0.25 = 15 / 11
    assert ev["tracked_fraction"] == 6 / 11 and ev["overhead"] == pytest.approx(15 / 11)
    assert ev["extra_per_tracked_step_s"] == 0.625 and ev["plain_iteration_s"] == 0.25
    assert ev["lower_bound"] is False and ev["measured_steps"] == 6
    assert ev["every"] == 3  # ceil(0.625 / (1.0 * 0.25)) = ceil(2.5)
    assert [q["quantity"] for q in ev["expensive_quantities"]] == [
        "hess_max_ev",
        "grad_norm",
        "alpha",  # ties with loss: by name
    ]
    assert [q["share"] for q in ev["expensive_quantities"]] == [0.5, 0.25, 0.125]
    assert ev["expensive_quantities"][0]["mean_s"] == 0.5
    assert f.id == "cost@0" and (f.first_step, f.last_step) == (0, 10)
    assert f.severity == "info"
    assert f.message == "cockpit adds about 136 % to training time (budget 100 %)"
    assert "every 3 steps" in f.suggestion and '{ name = "hess_max_ev", every = 3 }' in f.suggestion
    assert "'hess_max_ev' (50 %)" in f.suggestion
    assert f.source == "rule: cockpit's measured overhead against the user's budget"
    # a larger budget is met; a smaller one needs a sparser schedule
    assert Cost(max_overhead=1.5, min_records=6).check(measured_window()) == []
    assert Cost().check(measured_window()) == []  # 10 tracked steps needed by default
    (tight,) = Cost(max_overhead=0.25, severity="warning", min_records=6).check(measured_window())
    assert tight.evidence["every"] == 10 and tight.severity == "warning"  # ceil(0.625 / 0.0625)


def test_rare_costly_steps_count_with_their_share():
    # 4 steps with loss only cost 0.125 more, 2 with hess_max_ev 2.0 more: a median over
    # all six would say 0.125; each group's median weighted by its size says 0.75
    cheap = [record(s, 0.25, loss=0.01) for s in range(4)]
    costly = [record(s, 2.125, hess_max_ev=1.9) for s in (4, 5)]
    found = estimate(cheap + costly)
    assert found.extra_s == pytest.approx((4 * 0.125 + 2 * 2.0) / 6)
    # one outlier among steps that compute the same is ignored
    noisy = [record(s, 0.25, loss=0.01) for s in range(4)] + [record(4, 9.0, loss=0.01)]
    assert estimate(noisy).extra_s == 0.125


def test_everything_tracked_gives_a_lower_bound():
    none = (None, None)
    cost = [record(s, 0.625, 0, none, cockpit=0.5, iteration=0.75) for s in range(10)]
    cost.append(record(10, 0.625, 0, none, cockpit=0.5, iteration=None))  # written at close
    (f,) = Cost().check(Window({}, cost=cost))
    ev = f.evidence
    assert ev["lower_bound"] is True and ev["measured_steps"] == 10
    assert ev["overhead"] == 2.0  # 0.5 / (0.75 - 0.5)
    assert ev["every"] == 2 and ev["tracked_fraction"] == 1.0
    assert f.message == "cockpit adds at least 200 % to training time (budget 100 %)"
    assert "every 2 steps or less often" in f.suggestion


def test_too_few_or_broken_records_are_not_judged():
    few = [record(s, 5.0) for s in range(9)]
    assert Cost().check(Window({}, cost=few)) == []
    assert Cost(min_records=9).check(Window({}, cost=few))  # 9 enough when asked
    broken = [
        {"kind": "cost", "step": s, "block_s": "slow", "quantities_s": None} for s in range(9)
    ]
    assert Cost().check(Window({}, cost=broken)) == []
    assert not Cost().applies(Window({0: {"loss": 1.0}}))
    assert Cost().applies(Window({}, cost=few))


def test_the_runner_keeps_the_latest_cost_records_only():
    runner = DiagnosisRunner([Cost(min_records=2)], max_steps=3)
    found = [[f.id for f in runner.observe(record(s, 5.0, **SPENT))] for s in range(4)]
    # judged from 2 records on, once: when the window of 3 slid past step 0, the finding
    # it gives (cost@1) continues cost@0, whose stretch grows instead
    assert found == [[], ["cost@0"], [], []]
    assert (runner.reported["cost@0"].last_step, list(runner.reported)) == (3, ["cost@0"])
    assert [r["step"] for r in runner.cost] == [1, 2, 3]
    assert DiagnosisRunner([]).observe(record(0, 1.0)) == []


def _tracked_run(run, tmp_path, quantities, steps, **options):
    log = tmp_path / "log.jsonl"
    diagnoses = [{"name": "cost", "max_overhead": 0.5}]
    run(quantities, steps=steps, lr=0.1, log=log, diagnoses=diagnoses, **options)
    return log


def test_an_expensive_quantity_at_every_step_is_reported_within_11_steps(run, tmp_path):
    log = _tracked_run(run, tmp_path, ["loss", "hess_max_ev"], steps=12)
    # every step tracked: the lower bound, judged once 10 steps' iterations are known
    first = next(r for r in read_records(log) if r["kind"] == "finding")
    assert (first["id"], first["last_step"]) == ("cost@0", 9)  # found when step 10 entered
    (f,) = [f for f in read_run(log).findings if f["diagnosis"] == "cost"]
    assert f["first_step"] == 0 and f["last_step"] == 11  # logged again at close: all steps
    assert f["evidence"]["lower_bound"] is True and f["evidence"]["overhead"] > 0.5
    assert f["evidence"]["expensive_quantities"][0]["quantity"] == "hess_max_ev"
    assert f["evidence"]["every"] >= 2
    # the command line reports it again (info: exit code 0); as a warning it fails
    assert main(["diagnose", str(log), "--only", "cost", "--json"]) == 0
    found = diagnose(log, names=[{"name": "cost", "severity": "warning"}])
    assert [g.id for g in found] == ["cost@0"] and found[0].severity == "warning"
    assert exit_code(found) == 1


def test_every_second_step_tracked_compares_with_the_plain_steps(run, tmp_path, capsys):
    log = _tracked_run(run, tmp_path, [{"name": "hess_max_ev", "every": 2}], steps=24)
    (f,) = diagnose(log, names=[{"name": "cost", "max_overhead": 0.5}])
    ev = f.evidence
    assert ev["lower_bound"] is False and ev["tracked_fraction"] == 12 / 23  # 0, 2, ..., 22
    assert ev["overhead"] > 0.5 and ev["measured_steps"] == 11  # step 0: no plain step yet
    k = math.ceil(ev["extra_per_tracked_step_s"] / (0.5 * ev["plain_iteration_s"]) - 1e-9)
    assert ev["every"] == k >= 2
    assert main(["diagnose", str(log), "--only", "cost", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["exit_code"] == 0
    assert [g["diagnosis"] for g in payload["logs"][0]["findings"]] == ["cost"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_loss_every_10th_step_is_within_the_default_budget(run, tmp_path, seed):
    log = tmp_path / "log.jsonl"
    # a batch of 8192: the plain iteration (some 10 ms) is not shorter than the time slice
    # another process may take from a block, so such noise cannot pass for cockpit's cost
    quantities = [{"name": "loss", "every": 10}]
    run(quantities, steps=110, lr=0.1, batch=8192, seed=seed, log=log, diagnoses=["cost"])
    data = read_run(log)
    assert len(data.cost) == 11 and data.findings == []
    found = estimate(data.cost)
    assert found.measured == 10 and found.tracked_fraction == 11 / 101  # judged
    assert found.overhead < 1.0 and diagnose(log, names=["cost"]) == []
