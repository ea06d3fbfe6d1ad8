"""What :func:`~cockpit_core.testing.check_provider` checks, and its report.

The statistics requested from a provider (the built-in per-sample kinds, a
``per_sample_projection``, two ``per_sample_transform`` statistics, the curvature kinds and
a plugin's own kinds), each with the hint a failure message gives, chosen from the kinds
the provider claims; :class:`ProviderReport` records what was compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from cockpit_core.requirements import (
    BATCH_DOT,
    BATCH_L2,
    BATCH_PROJECTION,
    DIAG_GGN_EXACT,
    DIAG_HESSIAN,
    GRAD_BATCH,
    SUM_GRAD_SQUARED,
    diag_ggn_mc,
    per_sample_projection,
    per_sample_transform,
)
from cockpit_core.statistics.kinds import BUILTIN_KINDS, StatisticKind
from cockpit_core.statistics.provider import StatisticProvider
from cockpit_core.statistics.statistic import Statistic
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.providers.reference import cubes, directions, dots, dots_factored

PER_SAMPLE_CHECKS = (
    "batch_l2",
    "sum_grad_squared",
    "batch_dot",
    "grad_batch",
    "batch_projection",
    "per_sample_projection",
    "transform",
)
"""What is checked for a provider with ``per_sample = True``."""

CURVATURE_CHECKS = ("diag_hessian", "diag_ggn_exact", "diag_ggn_mc")
"""Built-in kinds that are not per-sample, checked when a provider lists them in ``kinds``."""

INJECTED_FAILURE = "conformance kit: injected failure"
"""Message of the transform that raises in the failure check."""


def _raise(*args: Any) -> Tensor:
    """A transform that always fails (the failure check injects it)."""
    raise RuntimeError(INJECTED_FAILURE)


CUBES = per_sample_transform("conformance_cubes", cubes, reduce="sum")
DOTS = per_sample_transform("conformance_dots", dots, reduce="gather", factored_fn=dots_factored)
PROJECTIONS = per_sample_projection("conformance_directions", directions)
FAILING = per_sample_transform("conformance_failing", _raise, reduce="sum", factored_fn=_raise)


@dataclass(frozen=True)
class StatisticCheck:
    """One checked statistic: a label, the statistic and how it is compared."""

    label: str
    stat: Statistic
    mode: str  # "per_sample", "hessian", "ggn", "mc", "present"
    hint: str


PER_SAMPLE_HINT = (
    "g_n must be the gradient of sample n's own loss (a mean-loss gradient scaled by 1/B "
    "must be multiplied by collection.batch_size), of the parameter's shape; hand it over "
    "with collection.deliver(index, DenseGrads(...)) and compare it with "
    "cockpit_core.testing.reference.per_sample_gradients"
)
_PROJECTION_HINT = (
    "projections use the final gradient p.grad: deliver the per-sample gradients with "
    "collection.deliver (the core forms the projections), do not project them yourself"
)
_HINTS = {
    "diag_hessian": (
        "the value is the diagonal of the Hessian of the *mean* mini-batch loss; compare "
        "with the diagonal of cockpit_core.testing.reference.explicit_hessian"
    ),
    "diag_ggn_exact": (
        "the value is the diagonal of the GGN (1/B) sum_n J_n^T H_n J_n of the mean "
        "mini-batch loss; compare with cockpit_core.testing.reference.explicit_ggn"
    ),
    "diag_ggn_mc": "a Monte-Carlo GGN diagonal is a mean of squares: finite and >= 0",
}


def claimed_checks(
    provider_cls: type[StatisticProvider], kinds: Iterable[Any] | None
) -> list[StatisticCheck]:
    """The checks for the kinds ``provider_cls`` claims (or the requested subset)."""
    claimed: list[Any] = list(PER_SAMPLE_CHECKS) if provider_cls.per_sample else []
    claimed += sorted(str(k) for k in provider_cls.kinds)
    if kinds is None:
        wanted = claimed
    else:
        wanted = list(kinds)
        for kind in wanted:
            per_sample_kind = isinstance(kind, StatisticKind) and kind.per_sample
            ok = (per_sample_kind and provider_cls.per_sample) or str(kind) in claimed
            if not ok:
                raise ConformanceError(
                    f"{provider_cls.__name__} does not claim {str(kind)!r}, so it cannot be "
                    f"checked: it claims {claimed or 'nothing'} (set per_sample = True or "
                    "list the kind in its kinds)."
                )
    out: list[StatisticCheck] = []
    for kind in wanted:
        name = str(kind)
        if name == "transform":
            out.append(
                StatisticCheck("transform[conformance_cubes]", CUBES, "per_sample", PER_SAMPLE_HINT)
            )
            out.append(
                StatisticCheck("transform[conformance_dots]", DOTS, "per_sample", PER_SAMPLE_HINT)
            )
        elif name == "per_sample_projection":
            out.append(StatisticCheck(name, PROJECTIONS, "per_sample", _PROJECTION_HINT))
        elif name in ("batch_l2", "sum_grad_squared", "batch_dot", "grad_batch"):
            stat = {
                "batch_l2": BATCH_L2,
                "sum_grad_squared": SUM_GRAD_SQUARED,
                "batch_dot": BATCH_DOT,
                "grad_batch": GRAD_BATCH,
            }[name]
            out.append(StatisticCheck(name, stat, "per_sample", PER_SAMPLE_HINT))
        elif name == "batch_projection":
            out.append(StatisticCheck(name, BATCH_PROJECTION, "per_sample", _PROJECTION_HINT))
        elif name == "diag_hessian":
            out.append(StatisticCheck(name, DIAG_HESSIAN, "hessian", _HINTS[name]))
        elif name == "diag_ggn_exact":
            out.append(StatisticCheck(name, DIAG_GGN_EXACT, "ggn", _HINTS[name]))
        elif name == "diag_ggn_mc":
            out.append(StatisticCheck(name, diag_ggn_mc(1), "mc", _HINTS[name]))
        elif isinstance(kind, StatisticKind):
            mode = "per_sample" if kind.per_sample else "present"
            hint = PER_SAMPLE_HINT if kind.per_sample else "deliver a value for it"
            out.append(StatisticCheck(name, Statistic(kind), mode, hint))
        elif name in BUILTIN_KINDS:  # "transform"-like kinds handled above; nothing else left
            raise ConformanceError(f"the kit has no check for the built-in kind {name!r}.")
        else:
            raise ConformanceError(
                f"{provider_cls.__name__} claims the kind {name!r}, which is not built in: pass "
                f"its StatisticKind object, check_provider({provider_cls.__name__}, "
                f"kinds=[..., MY_KIND]), so that the kit knows how to check it."
            )
    return out


@dataclass
class ProviderReport:
    """What :func:`check_provider` compared.

    Attributes:
        provider: The provider's name.
        checked: ``checked[problem][check]``: names of the parameters whose values matched
            the reference.
        unsupported: ``unsupported[problem][check]``: ``{parameter: reason}`` for the
            parameters ``supports()`` declined (not compared).

    """

    provider: str
    checked: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    unsupported: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"provider '{self.provider}':"]
        for problem, checks in self.checked.items():
            for label, names in checks.items():
                skipped = self.unsupported.get(problem, {}).get(label, {})
                lines.append(
                    f"  {problem} {label}: {len(names)} parameter(s) match"
                    + (f", {len(skipped)} not supported" if skipped else "")
                )
        return "\n".join(lines)
