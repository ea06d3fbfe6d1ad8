"""Hand a Cockpit's values to a framework's loggers: scalar dicts and findings.

:class:`ScalarReporter` is a Cockpit sink (``sink(record)``) that turns each ``values``
record into ``{tag: float}`` with the tag names of every other tracker sink
(:class:`cockpit_core.log.scalars.TagMap`: ``cockpit/loss``, ``cockpit/grad_norm/total``,
``cockpit/hess_max_ev/value``, ...) and passes it, with the record's step, to the host's
``emit(step, scalars)``: Lightning's ``logger.log_metrics``, the Hugging Face Trainer's
``log``. :class:`FindingReporter` hands each new finding of the Cockpit's diagnoses to the
host (its warning or logging utility) and the number of findings so far by severity to
``emit``. :class:`Headline` keeps a few headline values for a one-line console summary.
The dashboard as an image for loggers that take images is cockpit-dashboard's
(:func:`cockpit_dashboard.image.dashboard_image`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cockpit_core.diagnosis import SEVERITIES, Finding
from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import CockpitWarning
from cockpit_core.log.scalars import Scalar, TagMap

Emit = Callable[[int, dict[str, float]], None]
Announce = Callable[[Finding, str], None]


class ScalarReporter:
    """A Cockpit sink passing each step's scalars to ``emit(step, {tag: value})``.

    Histograms and non-scalar values are not passed (the Cockpit's log keeps them).
    ``emit`` failing is the Cockpit's concern: the sink is removed with a warning.

    Args:
        emit: Receives the step and the scalars of each ``values`` record.
        prefix: First part of every tag (``""`` for none).
        per_param: Pass per-parameter scalars (``cockpit/grad_norm/<param>``).
        per_param_max: Only while the Cockpit tracks at most this many parameters.

    """

    def __init__(
        self,
        emit: Emit,
        prefix: str = "cockpit",
        per_param: bool = True,
        per_param_max: int = 32,
    ):
        self.emit = emit
        self.tags = TagMap(prefix, per_param, per_param_max, histograms=False)

    def follow(self, cp: Cockpit) -> ScalarReporter:
        """Receive ``cp``'s records from now on (its header is read from ``cp`` itself)."""
        self.tags.header(cp.header())
        cp.sinks.append(self)
        return self

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Take one Cockpit record."""
        kind = record.get("kind")
        if kind == "header":
            self.tags.header(record)
        elif kind == "quantity_added":
            self.tags.quantity_added(record.get("quantity") or {})
        elif kind == "values":
            scalars = {
                e.tag: e.value for e in self.tags.values(record["values"]) if isinstance(e, Scalar)
            }
            if scalars:
                self.emit(int(record["step"]), scalars)


def finding_text(finding: Finding, label: str = "cockpit") -> str:
    """``"<label>: <finding.line()>. <suggestion>"``, the words of the core's warning."""
    text = f"{label}: {finding.line()}"
    return f"{text}. {finding.suggestion}" if finding.suggestion else text


HEADLINE = (
    "grad_norm/total",
    "alpha/alpha",
    "norm_test/total",
    "inner_test/total",
    "ortho_test/total",
    "mean_gsnr/total",
    "early_stopping/total",
    "hess_max_ev/value",
    "hess_trace/total",
    "tic_trace/total",
    "update_size/total",
    "loss",
)
"""Tags (without the prefix) a console line shows, in this order, as far as tracked."""
HEADLINE_MAX = 5
"""At most this many values per console line (of :data:`HEADLINE`)."""


class Headline:
    """A Cockpit sink keeping the latest value (and its step) of a few tags for a console line.

    Args:
        tags: Tags without the prefix (``"grad_norm/total"``); ``None``: the first
            :data:`HEADLINE_MAX` of :data:`HEADLINE` that the Cockpit records.

    """

    def __init__(self, tags: Sequence[str] | None = None):
        self.tags = list(tags) if tags is not None else None
        self.map = TagMap("", per_param=False, histograms=False)
        self.latest: dict[str, tuple[int, float]] = {}
        self.shown = -1  # the newest step of the last line
        self._keys: set[str] = set()

    def follow(self, cp: Cockpit) -> Headline:
        """Receive ``cp``'s records from now on."""
        self.map.header(cp.header())
        self._keys = {q.key for q in cp.quantities}
        cp.sinks.append(self)
        return self

    def _chosen(self) -> list[str]:
        """The tags of the line: given, or the first headline tags of tracked quantities."""
        if self.tags is not None:
            return self.tags
        tracked = [t for t in HEADLINE if t.split("/")[0] in self._keys]
        return tracked[:HEADLINE_MAX]

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Take one Cockpit record."""
        kind = record.get("kind")
        if kind == "header":
            self.map.header(record)
        elif kind == "quantity_added":
            quantity = record.get("quantity") or {}
            self.map.quantity_added(quantity)
            self._keys.add(str(quantity.get("key", quantity.get("name"))))
        elif kind == "values":
            step = int(record["step"])
            for event in self.map.values(record["values"]):
                if isinstance(event, Scalar):
                    old = self.latest.get(event.tag)
                    if old is None or old[0] <= step:
                        self.latest[event.tag] = (step, event.value)

    def line(self) -> str | None:
        """``cockpit step S: name value | ...`` of the newest values; ``None`` if nothing new.

        A value of an earlier step (``alpha`` and ``update_size`` of step ``S`` come with step
        ``S + 1``) carries its step: ``alpha -0.31 (step 3)``.
        """
        if not self.latest:
            return None
        newest = max(step for step, _ in self.latest.values())
        if newest <= self.shown:
            return None
        self.shown = newest
        tags = [t for t in self._chosen() if t in self.latest]
        parts = []
        for tag in tags:
            step, value = self.latest[tag]
            name = tag.removesuffix("/total").removesuffix("/value")
            name = "alpha" if name == "alpha/alpha" else name
            when = "" if step == newest else f" (step {step})"
            parts.append(f"{name} {value:.4g}{when}")
        return f"cockpit step {newest}: " + " | ".join(parts)


class FindingReporter:
    """Reports a Cockpit's new findings through the host instead of a ``CockpitWarning``.

    Each new finding goes to ``announce(finding, text)`` (the host's warning or logging
    utility; ``text`` is :func:`finding_text`), once, and with ``emit`` the number of
    findings so far of each severity to ``emit(step, {"<prefix>/findings/<severity>": n})``
    at the latest step the Cockpit completed: a step function per severity whose rises
    mark when findings were reported and whose last value is the count in ``cp.findings``.
    The log and the other sinks get the ``finding`` records as without a reporter.

    ``announce`` raising propagates as the core's warning would (e.g. under a warnings
    filter ``"error"``); ``emit`` raising is warned about once and the counts stop.

    Args:
        announce: Receives each new finding and its text.
        emit: Receives the counts (``None``: no counts, e.g. the host's loggers are off).
        prefix: First part of the count tags and the label of the text (``"cockpit"``).

    """

    def __init__(self, announce: Announce, emit: Emit | None = None, prefix: str = "cockpit"):
        self.announce, self.emit = announce, emit
        self.prefix = prefix.strip("/")
        self.counts = dict.fromkeys(SEVERITIES, 0)
        self._tracker: Any = None  # the followed Cockpit's Tracker
        self._step = 0

    def follow(self, cp: Cockpit) -> FindingReporter:
        """Report ``cp``'s findings from now on (its earlier ones are counted).

        Sets the Cockpit's ``Tracker.on_finding``, which replaces its own warning.
        """
        for finding in cp.findings:
            self.counts[finding.severity] += 1
        self._tracker = cp._tracker
        self._tracker.on_finding = self  # instead of the core's warning (tracker.py)
        return self

    def __call__(self, finding: Finding) -> None:
        """Take one new finding."""
        self.counts[finding.severity] += 1
        self.announce(finding, finding_text(finding, self.prefix or "cockpit"))
        if self.emit is None:
            return
        done = None if self._tracker is None else self._tracker.last_step
        self._step = max(self._step, finding.last_step, 0 if done is None else done)
        tag = f"{self.prefix}/findings" if self.prefix else "findings"
        try:
            self.emit(self._step, {f"{tag}/{s}": float(n) for s, n in self.counts.items()})
        except Exception as err:  # a logger failing must not hide the next findings
            self.emit = None
            warnings.warn(
                f"cockpit: the finding counts could not be logged and are no longer sent: "
                f"{err} ({type(err).__name__}); findings are still reported.",
                CockpitWarning,
                stacklevel=2,
            )
