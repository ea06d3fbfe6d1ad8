"""Protocol checks of :func:`~cockpit_core.testing.check_provider` beyond the values.

The provider class's declarations (:func:`check_class`), and runs that exercise the
contract: a parameter without gradient, a statistic that raises, two Cockpits at once,
``cp.attach`` of a wrapper model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core.plugin.registry import Registry, check_provider_class
from cockpit_core.requirements import BATCH_L2
from cockpit_core.statistics.provider import StatisticProvider
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.problems import Problem, prepared
from cockpit_core.testing.providers.checks import (
    FAILING,
    PER_SAMPLE_HINT,
    ProviderReport,
    StatisticCheck,
)
from cockpit_core.testing.providers.compare import compare_values, short_message
from cockpit_core.testing.providers.session import STEPS, TRACKED, Session, supported_params


def check_class(cls: Any) -> None:
    """The class's declarations: ``name``, ``description``, ``cost`` and claimed kinds."""
    try:
        check_provider_class(cls)
    except TypeError as err:
        raise ConformanceError(str(err)) from None
    if not isinstance(cls.description, str) or not cls.description.strip():
        raise ConformanceError(
            f"{cls.__name__}.description is empty: set a one-line description (shown by "
            "`cockpit plugins` and cp.check)."
        )
    cost = cls.cost
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost):
        raise ConformanceError(
            f"{cls.__name__}.cost = {cost!r}: set a finite number (the router prefers the "
            "lowest cost with backend='auto')."
        )
    if not isinstance(cls.kinds, (set, frozenset)) or not all(
        isinstance(k, str) for k in cls.kinds
    ):
        raise ConformanceError(
            f"{cls.__name__}.kinds = {cls.kinds!r}: use a frozenset of kind names."
        )
    if not cls.per_sample and not cls.kinds:
        raise ConformanceError(
            f"{cls.__name__} claims no kind: set per_sample = True (it delivers per-sample "
            "gradients) or list the kinds it computes in kinds."
        )


class _WithSpare(torch.nn.Module):
    """A problem's model plus a linear layer its forward pass never uses (no gradient)."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net
        self.spare = prepared(torch.nn.Linear(2, 2).double())

    def forward(self, x: Any) -> Tensor:  # noqa: D102
        out: Tensor = self.net(x)
        return out


class _Wrapper(torch.nn.Module):
    """Another model owning the same parameters (as DDP or a Lightning module would)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: Any) -> Tensor:  # noqa: D102
        out: Tensor = self.inner(x)
        return out


def check_no_gradient(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problem: Problem,
    probe: Sequence[StatisticCheck],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """A tracked parameter without gradient keeps ``None`` (checked in :func:`compare_values`)."""
    spare = Problem(
        f"{problem.name}+unused",
        lambda: _WithSpare(problem.make_model()),
        problem.inputs,
        problem.targets,
        problem.batch_size,
        problem.loss,
        problem.seed,
    )
    groups = supported_params(
        provider_cls, spare, probe, options, ProviderReport(provider_cls.name)
    )
    for names, group in groups.items():
        if not any(n.startswith("spare.") for n in names):
            continue
        run = Session(
            provider_cls,
            registry,
            spare,
            spare.make_model,
            group,
            names,
            options,
            what=f"problem '{problem.name}' with an unused Linear layer 'spare'",
        )
        run.train()
        compare_values(provider_cls, run, report)


def check_failing_statistic(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problems: Sequence[Problem],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """A transform that raises is reported missing; the other statistics still arrive."""
    good = StatisticCheck("batch_l2", BATCH_L2, "per_sample", PER_SAMPLE_HINT)
    bad = StatisticCheck("transform[conformance_failing]", FAILING, "per_sample", "")
    for problem in problems:
        unused = ProviderReport(provider_cls.name)
        groups = supported_params(provider_cls, problem, [good, bad], options, unused)
        names = next((n for n, g in groups.items() if len(g) == 2), None)
        if names is not None:
            break
    else:
        return  # supports() accepts batch_l2 and transforms together nowhere: nothing to inject
    run = Session(
        provider_cls,
        registry,
        problem,
        problem.make_model,
        [good, bad],
        names,
        options,
        what=f"problem '{problem.name}' with a per_sample_transform that raises",
    )
    run.train()  # raises ConformanceError if the failure escaped into backward()
    cls = provider_cls.__name__
    for step in TRACKED:
        seen = run.recorder.seen.get(step, {})
        value = seen.get(FAILING.describe())
        if not isinstance(value, str):
            raise ConformanceError(
                f"{cls}: a per_sample_transform that raises was not reported missing at step "
                f"{step} (got {short_message(value)}): record it with collection.fail(statistic, "
                "message) (Collection.deliver does so)."
            )
        other = seen.get(BATCH_L2.describe())
        if f"provider '{provider_cls.name}' raised" in value or isinstance(other, str):
            raise ConformanceError(
                f"{cls}: collect() raised when one statistic (a per_sample_transform) failed "
                f"at step {step} on problem '{problem.name}', so the Cockpit dropped the "
                f"provider's statistics ({value}). Catch the error of each statistic, record "
                "it with collection.fail(statistic, message) and deliver the others "
                "(Collection.deliver does so)."
            )
    run.checks = [good]
    compare_values(provider_cls, run, report)


def check_two_cockpits(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problem: Problem,
    probe: Sequence[StatisticCheck],
    names: Sequence[str],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """Two models with a Cockpit each, forward passes interleaved: both values are right."""
    runs = [
        Session(
            provider_cls,
            registry,
            problem,
            problem.make_model,
            probe,
            names,
            options,
            what=f"problem '{problem.name}' ({which} of two Cockpits at once)",
        )
        for which in ("first", "second")
    ]
    for step in range(STEPS):
        for run in runs:
            run.forward(step)
        for run in runs:
            run.backward()
    for run in runs:
        run.cp.close()
        compare_values(provider_cls, run, report)


def check_reattach(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problem: Problem,
    probe: Sequence[StatisticCheck],
    names: Sequence[str],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """``cp.attach`` of another model owning the same parameters: the values stay right."""
    run = Session(
        provider_cls,
        registry,
        problem,
        problem.make_model,
        probe,
        names,
        options,
        wrap=_Wrapper,
        what=f"problem '{problem.name}' after cp.attach of a wrapper model",
    )
    run.train()
    compare_values(provider_cls, run, report)
