"""The report of ``cp.check(model)``: per quantity a verdict, per parameter its provider.

:mod:`cockpit_core.check.coverage` builds the verdicts from the providers' ``supports()``
answers; with a sample, :mod:`cockpit_core.check.run` adds what one tracked step on a copy
of the model did (:class:`SampleReport`) and regroups the parameters by the providers that
delivered their statistics at that step. ``str(report)`` is what ``cockpit check`` prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cockpit_core.statistics.messages import name_list


@dataclass(frozen=True)
class CoverageRow:
    """One quantity's verdict.

    Attributes:
        quantity: Output key of the quantity.
        available: Whether it can be computed for the model.
        how: Which providers compute its statistics (e.g. ``"hooks; func for 'embed' (Embedding)"``).
        why: Why it is unavailable, or a caveat; empty if there is nothing to say.
        hint: What to do instead (another option, provider or quantity); may be empty.

    """

    quantity: str
    available: bool
    how: str
    why: str = ""
    hint: str = ""


@dataclass(frozen=True)
class ParamRoute:
    """How a group of parameters gets the statistics the quantities request.

    Attributes:
        names: The parameters' names (they share their routes and reasons).
        providers: For each requested kind, the provider serving it (``None``: none can, or
            after a sample step: none delivered it).
        reasons: ``(provider, reason)``: why each provider tried before the chosen one (of
            those that compute the kind) cannot serve it.
        how: ``(parameter, provider, line)``: how a provider serves a parameter, from its
            :meth:`~cockpit_core.statistics.provider.StatisticProvider.describe` (non-empty
            answers only).
        notes: What the sample step said about these parameters (why a statistic is
            missing, with the fix; a fallback to another provider).

    """

    names: tuple[str, ...]
    providers: tuple[tuple[str, str | None], ...]
    reasons: tuple[tuple[str, str], ...] = ()
    how: tuple[tuple[str, str, str], ...] = ()
    notes: tuple[str, ...] = ()

    def ways(self) -> dict[tuple[str, str], list[str]]:
        """``(provider, line) -> parameters``: how each provider serves which parameters."""
        out: dict[tuple[str, str], list[str]] = {}
        for name, provider, line in self.how:
            out.setdefault((provider, line), []).append(name)
        return out

    def inline(self) -> dict[str, str]:
        """``provider -> line`` for providers that serve every parameter of the group alike."""
        ways = self.ways()
        providers = [p for p, _ in ways]
        return {
            p: line
            for (p, line), names in ways.items()
            if providers.count(p) == 1 and len(names) == len(self.names)
        }

    @property
    def served(self) -> str:
        """``"hooks"``, or ``"batch_l2, sum_grad_squared: hooks; diag_hessian: none"``."""
        return self._providers(lambda provider: provider or "none")

    @property
    def label(self) -> str:
        """:attr:`served` with how each provider serves the group: ``"hooks (Linear rule)"``."""
        how = self.inline()

        def label(provider: str | None) -> str:
            if provider is None:
                return "none"
            return f"{provider} ({how[provider]})" if provider in how else provider

        return self._providers(label)

    def _providers(self, label: Callable[[str | None], str]) -> str:
        by_provider: dict[str | None, list[str]] = {}
        for kind, provider in self.providers:
            by_provider.setdefault(provider, []).append(kind)
        if len(by_provider) == 1:
            return label(next(iter(by_provider)))
        return "; ".join(f"{', '.join(k)}: {label(p)}" for p, k in by_provider.items())


@dataclass(frozen=True)
class QuantityOutcome:
    """What one quantity did at the sample step of ``cp.check(model, sample=...)``.

    Attributes:
        quantity: Output key of the quantity.
        state: ``"value"`` (it produced one), ``"started"`` (a two-step quantity: its value
            comes at the next tracked step), ``"no value"`` (it recorded nothing at this
            step, without an error), ``"error"`` or ``"not run"`` (the check could not give
            it what it needs, e.g. ``info["optimizer"]``).
        message: The error, or why it did not run; empty otherwise.

    """

    quantity: str
    state: str
    message: str = ""


@dataclass(frozen=True)
class SampleReport:
    """The tracked step ``cp.check(model, sample=...)`` ran on a copy of the model.

    Attributes:
        forward_passes: Forward passes of the model copy while the sample computed its loss.
        batch_size: Samples in the batch.
        quantities: Each quantity's outcome, in the Cockpit's order.
        problems: Statistics the step did not deliver for some parameter (the step's own
            messages, which name the parameters and the fix), or why the step was skipped.
        notes: Warnings of the step that are no errors (e.g. a provider's fallback).
        error: Why the sample's forward or backward pass raised; empty if it ran.

    """

    forward_passes: int
    batch_size: int
    quantities: tuple[QuantityOutcome, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    error: str = ""

    @property
    def ran(self) -> bool:
        """Whether the forward and backward pass of the sample ran."""
        return not self.error

    @property
    def ok(self) -> bool:
        """Whether the step ran, delivered every statistic and no quantity failed."""
        return self.ran and not self.problems and all(q.state != "error" for q in self.quantities)


@dataclass(frozen=True)
class CoverageReport:
    """The verdicts for all requested quantities, and the route of every parameter.

    Attributes:
        rows: One verdict per quantity, from the providers' ``supports()`` answers.
        params: The parameters grouped by their routes; after a sample step, by the
            providers that delivered their statistics at that step.
        sample: What the sample step did (``None``: no sample was given, no forward pass ran).

    """

    rows: tuple[CoverageRow, ...]
    params: tuple[ParamRoute, ...] = ()
    sample: SampleReport | None = None

    @property
    def ok(self) -> bool:
        """Whether every quantity can be computed (and did compute at the sample step)."""
        return all(r.available for r in self.rows) and (self.sample is None or self.sample.ok)

    def __str__(self) -> str:
        width = max([len(r.quantity) for r in self.rows] + [8])
        lines = []
        for r in self.rows:
            state = "ok" if r.available else "UNAVAILABLE"
            line = f"{r.quantity:<{width}}  {state:<11}  {r.how}"
            for extra in (r.why, f"hint: {r.hint}" if r.hint else ""):
                if extra:
                    line += f"\n{'':<{width}}  {'':<11}  {extra}"
            lines.append(line)
        shown = {note for p in self.params for note in p.notes}
        if self.sample is not None:
            lines.extend(["", *_sample_lines(self.sample, shown)])
        if self.params:
            lines.append("")
            lines.append(
                "parameters at the sample step: the provider that delivered their statistics"
                if self.sample is not None and self.sample.ran
                else "parameters: provider (and why the providers tried first cannot serve them)"
            )
            total = sum(len(p.names) for p in self.params)
            for p in self.params:
                lines.append(f"  {p.label}: {name_list(p.names, total, shown=6)}")
                inline = p.inline()
                lines.extend(
                    f"      {provider} ({line}): {name_list(names, total, shown=6)}"
                    for (provider, line), names in p.ways().items()
                    if provider not in inline
                )
                lines.extend(f"      not {provider}: {reason}" for provider, reason in p.reasons)
                lines.extend(f"      {note}" for note in p.notes)
        if self.sample is not None:
            lines.extend(["", _verdict(self)])
        return "\n".join(lines)


def _sample_lines(sample: SampleReport, shown: set[str]) -> list[str]:
    """The sample step's part of the report; ``shown``: messages the parameters list."""
    if not sample.ran:
        return [f"sample step: FAILED: {sample.error}"]
    passes = f"{sample.forward_passes} forward pass{'es' if sample.forward_passes != 1 else ''}"
    lines = [
        f"sample step: one tracked step on a copy of the model ({passes}, batch of "
        f"{sample.batch_size})"
    ]
    width = max([len(q.quantity) for q in sample.quantities] + [8])
    first: dict[str, str] = {}  # error message -> the first quantity that had it
    for q in sample.quantities:
        message = q.message
        if q.state == "error":
            if any(m in message for m in (*shown, *sample.problems)):
                message = "statistics are missing (the parameters below say which, and why)"
            elif message in first:
                message = f"the same error as '{first[message]}'"
            else:
                first[message] = q.quantity
        state = q.state.upper() if q.state == "error" else q.state
        lines.append(f"  {q.quantity:<{width}}  {state:<8}  {message}".rstrip())
    covered = [p for p in sample.problems if any(p in m or m in p for m in shown)]
    lines.extend(f"  problem: {p}" for p in sample.problems if p not in covered)
    lines.extend(f"  note: {n}" for n in sample.notes)
    return lines


def _verdict(report: CoverageReport) -> str:
    """The last line after a sample step: ok, or what failed."""
    sample = report.sample
    assert sample is not None
    if report.ok:
        return "result: ok (the sample step computed every quantity)"
    if not sample.ran:
        return "result: NOT OK: the sample step failed (see above)"
    failed = [q.quantity for q in sample.quantities if q.state == "error"]
    total = sum(len(p.names) for p in report.params)
    lacking = [n for p in report.params if None in dict(p.providers).values() for n in p.names]
    parts = []
    if failed:
        plural = "quantities" if len(failed) > 1 else "quantity"
        parts.append(f"{len(failed)} {plural} failed ({', '.join(failed)})")
    if lacking:
        parts.append(f"statistics missing for {name_list(lacking, total)}")
    if not all(r.available for r in report.rows):
        parts.append("some quantities are unavailable")
    return "result: NOT OK: " + ("; ".join(parts) or "see the problems above")
