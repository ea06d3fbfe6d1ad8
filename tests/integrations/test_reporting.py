"""FindingReporter in a plain loop: what a host gets for each finding, and when emit fails."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import FIRES_EXPECTED, data, fires_registry, plain_model  # noqa: E402

from cockpit_core import Cockpit, CockpitWarning  # noqa: E402
from cockpit_core.hosts.reporting import FindingReporter, finding_text  # noqa: E402


def _train(cp: Cockpit, model: torch.nn.Module, steps: range) -> list[str]:
    """SGD on the 16 samples at ``steps``; the messages of the CockpitWarnings."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in steps:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            with cp(step, info={"loss": loss, "batch_size": len(x), "optimizer": opt}):
                loss.backward()
            opt.step()
    return [str(w.message) for w in caught if issubclass(w.category, CockpitWarning)]


def _cockpit() -> tuple[Cockpit, torch.nn.Module]:
    model = plain_model()
    return Cockpit(model, ["loss"], diagnoses=["fires"], registry=fires_registry()), model


def test_a_followed_cockpit_announces_each_finding_once_and_counts_from_its_earlier_ones():
    cp, model = _cockpit()
    before = _train(cp, model, range(1))  # step 0: the Cockpit's own warnings
    assert before == [f"cockpit: {f.line()}. {f.suggestion}" for f in cp.findings]
    announced, emitted = [], []
    reporter = FindingReporter(
        lambda f, text: announced.append(text),
        lambda step, scalars: emitted.append((step, scalars)),
        prefix="run",
    ).follow(cp)
    assert reporter.counts == {"info": 1, "warning": 1, "error": 0}  # step 0's findings

    after = _train(cp, model, range(1, 2))

    assert after == []  # no CockpitWarning: the reporter took over
    new = cp.findings[2:]
    assert [f.id for f in new] == ["fires/one@1", "fires/always@1"]
    assert announced == [finding_text(f, "run") for f in new]
    assert emitted == [
        (1, {"run/findings/info": 1.0, "run/findings/warning": 1.0, "run/findings/error": 1.0}),
        (1, {"run/findings/info": 1.0, "run/findings/warning": 2.0, "run/findings/error": 1.0}),
    ]
    assert reporter.counts == FIRES_EXPECTED


def test_emit_failing_is_warned_once_and_findings_are_still_announced():
    cp, model = _cockpit()
    announced, calls = [], []

    def broken(step, scalars):
        calls.append(step)
        raise OSError("disk full")

    FindingReporter(lambda f, text: announced.append(text), broken).follow(cp)
    warned = _train(cp, model, range(2))

    assert len(calls) == 1  # not called again after failing
    assert warned == [
        "cockpit: the finding counts could not be logged and are no longer sent: disk full "
        "(OSError); findings are still reported."
    ]
    assert announced == [finding_text(f) for f in cp.findings] and len(announced) == 4
