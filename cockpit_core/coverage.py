"""Which quantities can be computed for a model, how, and why not: ``cp.check(model)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cockpit_core.backends.backpack import BackpackBackend
from cockpit_core.backends.routing import StatisticsRouter
from cockpit_core.quantity import Quantity


@dataclass(frozen=True)
class CoverageRow:
    """One quantity's verdict.

    Attributes:
        quantity: Output key of the quantity.
        available: Whether it can be computed for the model.
        how: Where its inputs come from (e.g. ``"BackPACK BatchGrad"``).
        why: Why it is unavailable, or a caveat; empty if there is nothing to say.
        hint: What to do instead (another option, backend or quantity); may be empty.

    """

    quantity: str
    available: bool
    how: str
    why: str = ""
    hint: str = ""


@dataclass(frozen=True)
class CoverageReport:
    """The verdicts for all requested quantities."""

    rows: tuple[CoverageRow, ...]

    @property
    def ok(self) -> bool:
        """Whether every quantity can be computed."""
        return all(r.available for r in self.rows)

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
        return "\n".join(lines)


_HOW = {
    "batch_l2": "BackPACK BatchGrad",
    "sum_grad_squared": "BackPACK BatchGrad",
    "batch_dot": "BackPACK BatchGrad",
    "batch_projection": "BackPACK BatchGrad",
    "grad_batch": "BackPACK BatchGrad",
    "transform": "BackPACK BatchGrad",
    "diag_hessian": "BackPACK DiagHessian",
    "diag_ggn_exact": "BackPACK DiagGGNExact",
    "diag_ggn_mc": "BackPACK DiagGGNMC",
}


def check_model(
    quantities: list[Quantity],
    model: torch.nn.Module,
    backend: BackpackBackend | StatisticsRouter,
) -> CoverageReport:
    """Decide for each quantity whether its statistics can be computed for ``model``.

    With a :class:`StatisticsRouter`, per-sample statistics count as available when the
    ``torch.func`` path covers the modules BackPACK does not support (``cp.attach``).
    """
    has_attention = any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())
    rows = []
    for q in quantities:
        requirements = q.all_requirements()
        stats = {s.identity: s for r in requirements for s in r.statistics}.values()
        hows, problems, hints = [], [], []
        for stat in stats:
            if isinstance(backend, StatisticsRouter):
                how, problem, hint = backend.coverage(model, stat)
                hows.append(how)
                if problem:
                    problems.append(problem)
                    hints.append(hint)
                continue
            hows.append(_HOW[stat.kind])
            bad = backend.unsupported_modules(model, stat)
            if bad:
                mods = ", ".join(f"'{n}' ({c})" for n, c in bad)
                problems.append(f"{_HOW[stat.kind]} does not support {mods}")
        caveat = ""
        if any(r.loss_graph for r in requirements):
            hows.append("autograd Hessian-vector products")
            if has_attention and not _math_attention(backend, model):
                caveat = (
                    "nn.MultiheadAttention's fused CPU kernel has no double backward: run the "
                    "forward pass under torch.nn.attention.sdpa_kernel(SDPBackend.MATH)."
                )
        how = ", ".join(dict.fromkeys(hows)) or "no statistics beyond p.grad"
        if problems:
            hint = " ".join(dict.fromkeys(h for h in hints if h))
            rows.append(CoverageRow(q.key, False, how, "; ".join(problems), hint))
        else:
            rows.append(CoverageRow(q.key, True, how, caveat))
    return CoverageReport(tuple(rows))


def _math_attention(backend: object, model: torch.nn.Module) -> bool:
    """Whether cockpit runs ``model``'s attention in the math kernel (attached model)."""
    attached = getattr(backend, "attached", None)
    on = getattr(backend, "math_attention", False)
    return bool(on) and attached is not None and attached.model is model
