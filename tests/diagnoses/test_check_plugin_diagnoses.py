"""check_plugin checks a plugin's diagnoses: protocol, options, and check() on short windows."""

from __future__ import annotations

import pytest

from cockpit_core.testing import ConformanceError, check_plugin
from cockpit_core.testing.diagnosis_checks import check_diagnosis

GOOD = """
from pydantic import Field

from cockpit_core import hookimpl
from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig

SEEN = []


class HighLossConfig(DiagnosisConfig):
    level: float = Field(0.0, description="Report a loss above this.")


class HighLoss(Diagnosis):
    name = "fakeplug_high_loss"
    reads = ("loss",)
    source = "rule: loss > level"
    Config = HighLossConfig

    def check(self, window):
        steps, loss = window.series("loss")
        SEEN.append(len(steps))
        high = steps[loss > self.config.level]
        if not len(high):
            return []
        return [self.finding("", "info", high[0], high[-1], "the loss is high",
                             {"level": self.config.level, "steps": high})]


@hookimpl
def register_diagnoses(register):
    register(HighLoss)
"""

BROKEN = """
from pydantic import ConfigDict

from cockpit_core import hookimpl
from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig


class LaxConfig(DiagnosisConfig):
    model_config = ConfigDict(extra="allow")
    level: float = 1.0


class Raising(Diagnosis):
    name = "fakeplug_raising"
    reads = ("grad_norm",)

    def check(self, window):
        return window.values("grad_norm")[0][1]["norm"]  # grad_norm has no field "norm"


class Lax(Diagnosis):
    name = "fakeplug_lax"
    reads = ("loss",)
    Config = LaxConfig

    def check(self, window):
        return []


@hookimpl
def register_diagnoses(register):
    register(Raising)
    register(Lax)
"""


def test_a_good_diagnosis_passes_and_check_sees_a_real_run(fake_distribution):
    fake_distribution("fakeplug-diag", "fakeplug_diag", GOOD)
    report = check_plugin("fakeplug_diag")
    assert report.checked == ["diagnosis fakeplug_high_loss"]
    import fakeplug_diag

    # the empty window does not apply (no loss); the run's window holds 4 steps of loss
    assert fakeplug_diag.SEEN == [4]


def test_a_broken_diagnosis_reports_every_problem(fake_distribution):
    fake_distribution("fakeplug-broken-diag", "fakeplug_broken_diag", BROKEN)
    with pytest.raises(ConformanceError) as err:
        check_plugin("fakeplug_broken_diag")
    text = str(err.value)
    assert "2 problems" in text
    assert "diagnosis 'fakeplug_raising': check() raised KeyError: 'norm' on the window" in text
    assert "diagnosis 'fakeplug_lax': options ['level'] of LaxConfig have no description" in text


def test_invalid_options_and_a_class_that_is_not_a_diagnosis(fake_distribution):
    fake_distribution("fakeplug-diag", "fakeplug_diag", GOOD)
    import fakeplug_diag

    with pytest.raises(ConformanceError, match="do not validate"):
        check_diagnosis(fakeplug_diag.HighLoss, options={"level": "high"})
    with pytest.raises(ConformanceError, match="not a subclass"):
        check_diagnosis(int)
