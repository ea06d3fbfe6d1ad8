"""Which quantities can be computed for a model, how, and why not: ``cp.check(model)``.

The verdicts come from the providers' ``supports()`` answers, without a forward pass
(:class:`~cockpit_core.check.report.CoverageReport`). With a sample,
``cp.check(model, sample=...)`` also runs one tracked step on a copy of the model
(:mod:`cockpit_core.check.run`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable

import torch

# CoverageReport is also imported from here (by the engine): an explicit re-export
from cockpit_core.check.report import CoverageReport as CoverageReport
from cockpit_core.check.report import CoverageRow, ParamRoute
from cockpit_core.engine import loop_checks
from cockpit_core.errors import CockpitWarning
from cockpit_core.quantity import Quantity
from cockpit_core.statistics.gather import requested_kind
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.provider import StatisticProvider
from cockpit_core.statistics.router import StatisticsRouter


def _summary(router: StatisticsRouter, kind: StatisticKind) -> str:
    """``"hooks; func for 'embed' (Embedding)"``: the main provider, then the others."""
    routes = [
        (r.provider, slot)
        for r, slot in zip(router.routes(kind), router.slots)
        if r.provider is not None and slot.param.requires_grad
    ]
    if not routes:
        return "no provider"
    counts: dict[str, int] = {}
    for provider, _ in routes:
        counts[provider] = counts.get(provider, 0) + 1
    main = max(counts, key=lambda n: counts[n])
    parts = [main]
    for provider in counts:
        if provider != main:
            labels = ", ".join(dict.fromkeys(s.label for p, s in routes if p == provider))
            parts.append(f"{provider} for {labels}")
    return "; ".join(parts)


def check_model(
    quantities: list[Quantity],
    model: torch.nn.Module,
    router: StatisticsRouter,
    math_attention: bool = False,
) -> CoverageReport:
    """Decide for each quantity whether its statistics can be computed for ``model``.

    ``router`` must have ``model`` attached (``Cockpit.check`` attaches it).

    Args:
        quantities: The quantities to check.
        model: The model.
        router: The Cockpit's statistics router.
        math_attention: Whether cockpit runs the model's attention in the math kernel.

    """
    if router.model is not model:
        router.attach(model)  # a report on another model than the attached one
    has_attention = any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())
    rows = []
    kinds: dict[str, StatisticKind] = {}
    for q in quantities:
        requirements = q.all_requirements()
        stats = {s.identity: s for r in requirements for s in r.statistics}.values()
        hows, problems, hints = [], [], []
        for stat in stats:
            kinds.setdefault(str(stat.kind), requested_kind(stat))
            hows.append(_summary(router, requested_kind(stat)))
            _, problem = router.describe(stat)
            if problem:
                problems.append(problem)
                hints.append(getattr(stat.kind, "alternative", ""))
        caveat = ""
        if any(r.loss_graph for r in requirements):
            hows.append("autograd Hessian-vector products")
            if has_attention and not math_attention:
                caveat = (
                    "nn.MultiheadAttention's fused CPU kernel has no double backward: run the "
                    "forward pass under torch.nn.attention.sdpa_kernel(SDPBackend.MATH), or "
                    "cp.attach(model, loss_fn)."
                )
        how = ", ".join(dict.fromkeys(h for h in hows if h != "no provider")) or (
            "no statistics beyond p.grad" if not problems else "no provider"
        )
        if problems:
            hint = " ".join(dict.fromkeys(h for h in hints if h))
            rows.append(CoverageRow(q.key, False, how, "; ".join(problems), hint))
        else:
            rows.append(CoverageRow(q.key, True, how, caveat))
    return CoverageReport(tuple(rows), _param_routes(router, list(kinds.values())))


def _param_routes(router: StatisticsRouter, kinds: list[StatisticKind]) -> tuple[ParamRoute, ...]:
    """Parameters grouped by their routes, how they are served and the reasons of the others."""
    # (providers, reasons) -> (names, how)
    groups: dict[
        tuple[tuple[tuple[str, str | None], ...], tuple[tuple[str, str], ...]],
        tuple[list[str], list[tuple[str, str, str]]],
    ] = {}
    for i, slot in enumerate(router.slots):
        if not slot.param.requires_grad or not kinds:
            continue
        served = tuple((str(kind), router.routes(kind)[i].provider) for kind in kinds)
        reasons = tuple(dict.fromkeys(r for kind in kinds for r in router.reasons(kind, i)))
        group = groups.setdefault((served, reasons), ([], []))
        group[0].append(slot.name)
        group[1].extend(described(router, i, [p for _, p in served]))
    return tuple(ParamRoute(tuple(n), s, r, tuple(h)) for (s, r), (n, h) in groups.items())


def described(
    router: StatisticsRouter, index: int, providers: Iterable[str | None]
) -> list[tuple[str, str, str]]:
    """``(parameter, provider, line)`` for each of ``providers`` that says how it serves ``index``.

    A provider's ``describe`` is plugin code: one that raises says nothing.
    """
    slot = router.slots[index]
    out = []
    for name in dict.fromkeys(p for p in providers if p is not None):
        provider = router.providers.get(name)
        try:
            line = str(provider.describe(slot) or "").strip() if provider is not None else ""
        except Exception:  # a broken describe() must not hide the report
            line = ""
        if line:
            out.append((slot.name, name, line.splitlines()[0]))
    return out


def refuse_batch_norm(
    report: CoverageReport,
    model: torch.nn.Module,
    quantities: Iterable[Quantity],
    params: Iterable[torch.Tensor],
) -> CoverageReport:
    """``report`` with per-sample quantities unavailable while tracked BatchNorm layers train.

    BatchNorm in training mode mixes the samples of a batch, so per-sample gradients are
    not defined there.
    """
    tracked = {id(p) for p in params}
    modules = [
        name or type(m).__name__
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        and m.training
        and any(id(p) in tracked for p in m.parameters(recurse=False))
    ]
    if not modules:
        return report
    per_sample = {
        q.key
        for q in quantities
        if any(s.per_sample for r in q.all_requirements() for s in r.statistics)
    }
    why = f"BatchNorm module(s) {loop_checks.names_text(modules)}: {loop_checks.BATCH_NORM_REASON}"
    hint = "Use GroupNorm/LayerNorm, or track these quantities with the model in eval mode."
    rows = tuple(
        dataclasses.replace(row, available=False, why=why, hint=hint)
        if row.available and row.quantity in per_sample
        else row
        for row in report.rows
    )
    return dataclasses.replace(report, rows=rows)


def reads_forward_pass(quantity: Quantity) -> bool:
    """Whether ``quantity`` declares probes (it reads the forward pass: it needs the model)."""
    return any(r.probes for r in quantity.all_requirements())


def warn_forward_pass_without_model(quantities: Iterable[Quantity]) -> None:
    """Warn now about quantities that read the forward pass of a model cockpit does not know."""
    readers = [q.key for q in quantities if reads_forward_pass(q)]
    if readers:
        warnings.warn(
            f"cockpit: {', '.join(repr(k) for k in readers)} read the forward pass, but "
            "cockpit does not know the model: give it the model, Cockpit(model, ...) or "
            "cp.attach(model); until then they record an error at every tracked step.",
            CockpitWarning,
            stacklevel=3,
        )


def warn_unprovided_kinds(
    quantities: Iterable[Quantity], providers: Iterable[StatisticProvider]
) -> None:
    """Warn now about statistics that no installed provider computes at all."""
    providers = list(providers)
    for q in quantities:
        for stat in {s.identity: s for r in q.all_requirements() for s in r.statistics}.values():
            kind = stat.kind
            if isinstance(kind, StatisticKind) and any(p.delivers(kind) for p in providers):
                continue
            hint = getattr(stat.kind, "install_hint", "")
            warnings.warn(
                f"cockpit: no installed statistics provider computes {stat.describe()}, "
                f"which '{q.key}' needs; it will record an error at every tracked step."
                + (f" Hint: {hint}." if hint else ""),
                CockpitWarning,
                stacklevel=3,
            )
