"""The runner of diagnoses while training: how often it checks, and one finding per stretch."""

from cockpit_core.diagnosing.runner import CHECKS_PER_WINDOW, DiagnosisRunner
from cockpit_core.diagnosis import Diagnosis


class Positive(Diagnosis):
    """The loss is above 0 from the first such step in the window to the last."""

    name = "positive"
    reads = ("loss",)
    source = "a test rule"

    def __init__(self, seen=None):
        super().__init__()
        self.seen = seen if seen is not None else []

    def check(self, window):
        steps, loss = window.series("loss")
        self.seen.append(int(steps[-1]))
        high = steps[loss > 0]
        if not len(high):
            return []
        return [self.finding("", "warning", high[0], high[-1], "positive", {"n": len(high)})]


def values(step, loss):
    return {"kind": "values", "step": step, "values": {"loss": loss}}


def test_checks_run_every_len_window_over_20_new_steps():
    seen = []
    runner = DiagnosisRunner([Positive(seen)], max_steps=500)
    for step in range(700):
        runner.observe(values(step, -1.0))
    expected, new = [], 0  # the rule: check when the new steps reach len(window) // 20
    for step in range(700):
        new += 1
        if new >= max(1, min(step + 1, 500) // CHECKS_PER_WINDOW):
            expected.append(step)
            new = 0
    assert seen == expected
    assert seen[:40] == list(range(39)) + [40]  # every step while the window is short
    assert [b - a for a, b in zip(seen[-5:], seen[-4:])] == [25] * 4  # full window of 500
    assert seen[-1] == 685  # steps 686 to 699 wait for the next check
    runner.finish()
    assert seen[-1] == 699  # finish checks what came since the last check
    runner.finish()
    assert len(seen) == len(expected) + 1  # nothing new: no check


def test_every_step_checks_at_every_step():
    seen = []
    runner = DiagnosisRunner([Positive(seen)], max_steps=500, every_step=True)
    for step in range(300):
        runner.observe(values(step, -1.0))
    assert seen == list(range(300))


def test_a_condition_longer_than_the_window_is_one_finding_with_its_whole_stretch():
    runner = DiagnosisRunner([Positive()], max_steps=20)
    reported = []
    for step in range(100):
        reported += runner.observe(values(step, 1.0))
    # the window slid 80 steps past step 0: each check finds positive@<window start>,
    # which continues the reported finding instead of being a new one
    assert [(f.id, f.first_step, f.last_step) for f in reported] == [("positive@0", 0, 0)]
    new, changed = runner.finish()
    assert new == []
    assert [(f.id, f.first_step, f.last_step) for f in changed] == [("positive@0", 0, 99)]
    assert runner.finish() == ([], [])  # each change once


def test_a_new_stretch_after_a_gap_is_a_new_finding_and_finish_reports_late_ones():
    runner = DiagnosisRunner([Positive()], max_steps=5)
    reported = []
    for step, loss in enumerate([1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0]):
        reported += runner.observe(values(step, loss))
    # steps 0-1 left the window of 5 before step 7: positive@7 does not overlap positive@0
    assert [(f.id, f.first_step, f.last_step) for f in reported] == [
        ("positive@0", 0, 0),
        ("positive@7", 7, 7),
    ]
    assert runner.finish() == ([], [runner.reported["positive@0"]])
    assert runner.reported["positive@0"].last_step == 1
