"""Conformance kit for statistics providers: protocol checks against autograd references.

Run it in your provider's tests::

    from cockpit_core.testing import check_provider

    def test_my_provider_follows_the_protocol():
        check_provider(MyProvider)

:func:`check_provider` trains the shipped tiny problems with real Cockpits
(``backend=<the provider's name>``, ``cp.attach(model, loss_fn)``), for every kind the
provider claims and every parameter its ``supports()`` accepts, and compares each
statistic with a brute-force autograd definition in float64 (``docs/providers.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.provider import StatisticProvider
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.problems import Problem, tiny_cnn, tiny_mlp
from cockpit_core.testing.providers.checks import (
    CURVATURE_CHECKS,
    PER_SAMPLE_CHECKS,
    ProviderReport,
    StatisticCheck,
    claimed_checks,
)
from cockpit_core.testing.providers.compare import TOLERANCE, compare_values
from cockpit_core.testing.providers.protocol import (
    check_class,
    check_failing_statistic,
    check_no_gradient,
    check_reattach,
    check_two_cockpits,
)
from cockpit_core.testing.providers.session import (
    STEPS,
    TRACKED,
    Session,
    session_registry,
    supported_params,
)

__all__ = [
    "CURVATURE_CHECKS",
    "PER_SAMPLE_CHECKS",
    "STEPS",
    "TOLERANCE",
    "TRACKED",
    "ProviderReport",
    "check_provider",
    "default_problems",
]


def default_problems() -> list[Problem]:
    """The shipped tiny problems: MLP, CNN and transformer (not extended for BackPACK)."""
    from cockpit_core.testing.transformer import tiny_transformer

    return [tiny_mlp(), tiny_cnn(), tiny_transformer(extended=False)]


def check_provider(
    provider_cls: type[StatisticProvider],
    kinds: Iterable[str | StatisticKind] | None = None,
    problems: Sequence[Problem] | None = None,
    options: Mapping[str, Any] | None = None,
) -> ProviderReport:
    """Check a statistics provider against the protocol and autograd references.

    **Values.** For every problem, a Cockpit with ``backend=<provider_cls.name>`` and
    ``cp.attach(model, problem.individual_losses)`` trains three steps (steps 0 and 2
    tracked, step 1 not: arming and disarming are exercised) on the parameters that
    ``supports()`` accepts, and every statistic is compared at both tracked steps with a
    float64 autograd reference computed on a fresh copy of the model:

    * per-sample kinds (when ``provider_cls.per_sample``): ``batch_l2``,
      ``sum_grad_squared``, ``batch_dot``, ``grad_batch``, ``batch_projection``, a
      ``per_sample_projection`` on two directions, and two ``per_sample_transform`` statistics
      (one needing every element, one with a ``factored_fn``), against
      :func:`~cockpit_core.testing.reference.per_sample_gradients` (one autograd call per
      sample); a per-sample :class:`StatisticKind` passed in ``kinds`` is compared with
      its own ``from_per_sample`` applied to those loop gradients;
    * ``diag_hessian`` against the diagonal of
      :func:`~cockpit_core.testing.reference.explicit_hessian`; ``diag_ggn_exact``
      against the diagonal of :func:`~cockpit_core.testing.reference.explicit_ggn`;
    * ``diag_ggn_mc`` only for its shape, finiteness and non-negativity: agreement with
      the GGN in expectation needs many samples and is out of scope;
    * other non-per-sample kinds (passed as :class:`StatisticKind` objects): only that a
      finite value is delivered for every accepted parameter with a gradient.

    **Tolerance.** The error of a value is ``max |value - reference|`` divided by the
    largest reference entry of that parameter (at least ``1e-6`` of the largest entry
    over all checked parameters, so entries that are zero in exact arithmetic may carry
    the rounding of the others). Everything runs in float64, where one operation rounds
    by ``1.1e-16`` and the statistics of the tiny problems are sums of at most ~100
    products, so exact computations in a different order agree to ~1e-14;
    :data:`TOLERANCE` = ``1e-10`` leaves four orders of margin and still catches every
    real mistake (a wrong ``1/B`` scaling, a swapped sample, a float32 computation at
    ~1e-7).

    **Protocol.** A snake_case ``name``, a ``description``, a finite ``cost``; ``supports()``
    returns ``None`` or a non-empty string; the provider delivers every statistic for
    every accepted parameter with a gradient and leaves parameters without a gradient
    ``None``; a statistic that raises (an injected ``per_sample_transform``) is reported
    missing while the other statistics are delivered and training goes on; two Cockpits
    with the provider work at once (forward passes of two models interleaved); after
    ``cp.attach`` of another model (a wrapper owning the same parameters) the values are
    still right.

    Args:
        provider_cls: The provider class (a :class:`~cockpit_core.StatisticProvider`).
        kinds: Restrict the checks to these: names of :data:`PER_SAMPLE_CHECKS` and
            :data:`CURVATURE_CHECKS`, or :class:`StatisticKind` objects of kinds your
            plugin registers. Default: every kind the provider claims.
        problems: The problems to train (default :func:`default_problems`: ``tiny_mlp``,
            ``tiny_cnn`` and ``tiny_transformer(extended=False)``). A provider that needs
            prepared models (BackPACK: ``extend``) passes problems whose ``make_model``
            prepares them; ``tiny_mlp()`` and ``tiny_cnn()`` are extended already when
            cockpit-backpack is installed.
        options: Extra keyword arguments for every ``Cockpit(...)``, e.g.
            ``{"chunk_size": 2}`` (they reach the provider as its ``options``).

    Returns:
        What was compared, and which parameters ``supports()`` declined.

    Raises:
        ConformanceError: The first failed check; the message names the kind, the
            problem and parameter, the error, and how to fix it.

    """
    check_class(provider_cls)
    checks = claimed_checks(provider_cls, kinds)
    problems = list(problems) if problems is not None else default_problems()
    options = dict(options or {})
    registry = session_registry(provider_cls)
    report = ProviderReport(provider_cls.name)
    first: tuple[Problem, list[str], list[StatisticCheck]] | None = None
    for problem in problems:
        groups = supported_params(provider_cls, problem, checks, options, report)
        for names, group in groups.items():
            run = Session(
                provider_cls, registry, problem, problem.make_model, group, names, options
            )
            run.train()
            compare_values(provider_cls, run, report)
            if first is None:
                first = (problem, list(names), group)
    if first is None:
        raise ConformanceError(
            f"{provider_cls.__name__}.supports() accepted no parameter of any problem "
            f"({', '.join(p.name for p in problems)}) for any of {[c.label for c in checks]}, "
            "so nothing could be checked: pass problems= with models it supports."
        )
    problem, first_names, group = first
    probe = [c for c in group if c.mode != "mc"][:1] or group[:1]
    check_no_gradient(provider_cls, registry, problem, probe, options, report)
    if provider_cls.per_sample:
        check_failing_statistic(provider_cls, registry, problems, options, report)
    check_two_cockpits(provider_cls, registry, problem, probe, first_names, options, report)
    check_reattach(provider_cls, registry, problem, probe, first_names, options, report)
    return report
