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

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from cockpit_core.attention import math_attention
from cockpit_core.cockpit import Cockpit
from cockpit_core.context import StepContext
from cockpit_core.errors import UnsupportedModelError
from cockpit_core.quantity import Quantity
from cockpit_core.registry import ProviderEntry, Registry, check_provider_class
from cockpit_core.requirements import (
    BATCH_DOT,
    BATCH_L2,
    BATCH_PROJECTION,
    DIAG_GGN_EXACT,
    DIAG_HESSIAN,
    GRAD_BATCH,
    SUM_GRAD_SQUARED,
    Requirements,
    Statistic,
    diag_ggn_mc,
    per_sample_projection,
    per_sample_transform,
)
from cockpit_core.schedules import ExplicitSteps
from cockpit_core.statistics.kinds import BUILTIN_KINDS, StatisticKind
from cockpit_core.statistics.per_sample import DenseGrads
from cockpit_core.statistics.provider import StatisticProvider
from cockpit_core.statistics.router import StatisticsRouter
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.problems import Problem, extend, tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import explicit_ggn, explicit_hessian, per_sample_gradients

TOLERANCE = 1e-10
"""Largest accepted error of a value, relative to the size of its reference (see
:func:`check_provider`)."""

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

STEPS = 3
TRACKED = (0, 2)
"""Each run trains :data:`STEPS` steps and tracks these (step 1 is untracked in between)."""

INJECTED_FAILURE = "conformance kit: injected failure"
"""Message of the transform that raises in the failure check."""


def _directions(grad: Tensor, param: Tensor) -> Tensor:
    """Two directions for ``per_sample_projection``: the final gradient and ``cos(theta)``."""
    return torch.stack([grad, torch.cos(param)])


def _cubes(grads: Tensor, param: Tensor) -> Tensor:
    """``theta * sum_n g_n^3``: a transform needing every element, additive over samples."""
    return (grads**3).sum(0) * param


def _dots(grads: Tensor, param: Tensor) -> Tensor:
    """``g_n . theta``, ``[B]`` (from the materialized gradients)."""
    return grads.flatten(1) @ param.flatten()


def _dots_factored(grads: Any, param: Tensor) -> Tensor:
    """``g_n . theta`` from a factored form (:meth:`PerSampleGrads.dot`)."""
    return grads.dot(param.unsqueeze(0))[:, 0]


def _raise(*args: Any) -> Tensor:
    raise RuntimeError(INJECTED_FAILURE)


CUBES = per_sample_transform("conformance_cubes", _cubes, reduce="sum")
DOTS = per_sample_transform("conformance_dots", _dots, reduce="gather", factored_fn=_dots_factored)
PROJECTIONS = per_sample_projection("conformance_directions", _directions)
FAILING = per_sample_transform("conformance_failing", _raise, reduce="sum", factored_fn=_raise)


@dataclass(frozen=True)
class _Check:
    """One checked statistic: a label, the statistic and how it is compared."""

    label: str
    stat: Statistic
    mode: str  # "per_sample", "hessian", "ggn", "mc", "present"
    hint: str


_PER_SAMPLE_HINT = (
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


def _checks(provider_cls: type[StatisticProvider], kinds: Iterable[Any] | None) -> list[_Check]:
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
    out: list[_Check] = []
    for kind in wanted:
        name = str(kind)
        if name == "transform":
            out.append(
                _Check("transform[conformance_cubes]", CUBES, "per_sample", _PER_SAMPLE_HINT)
            )
            out.append(_Check("transform[conformance_dots]", DOTS, "per_sample", _PER_SAMPLE_HINT))
        elif name == "per_sample_projection":
            out.append(_Check(name, PROJECTIONS, "per_sample", _PROJECTION_HINT))
        elif name in ("batch_l2", "sum_grad_squared", "batch_dot", "grad_batch"):
            stat = {
                "batch_l2": BATCH_L2,
                "sum_grad_squared": SUM_GRAD_SQUARED,
                "batch_dot": BATCH_DOT,
                "grad_batch": GRAD_BATCH,
            }[name]
            out.append(_Check(name, stat, "per_sample", _PER_SAMPLE_HINT))
        elif name == "batch_projection":
            out.append(_Check(name, BATCH_PROJECTION, "per_sample", _PROJECTION_HINT))
        elif name == "diag_hessian":
            out.append(_Check(name, DIAG_HESSIAN, "hessian", _HINTS[name]))
        elif name == "diag_ggn_exact":
            out.append(_Check(name, DIAG_GGN_EXACT, "ggn", _HINTS[name]))
        elif name == "diag_ggn_mc":
            out.append(_Check(name, diag_ggn_mc(1), "mc", _HINTS[name]))
        elif isinstance(kind, StatisticKind):
            mode = "per_sample" if kind.per_sample else "present"
            hint = _PER_SAMPLE_HINT if kind.per_sample else "deliver a value for it"
            out.append(_Check(name, Statistic(kind), mode, hint))
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
    _check_class(provider_cls)
    checks = _checks(provider_cls, kinds)
    problems = list(problems) if problems is not None else default_problems()
    options = dict(options or {})
    registry = _registry(provider_cls)
    report = ProviderReport(provider_cls.name)
    first: tuple[Problem, list[str], list[_Check]] | None = None
    for problem in problems:
        groups = _supported(provider_cls, problem, checks, options, report)
        for names, group in groups.items():
            run = _Session(
                provider_cls, registry, problem, problem.make_model, group, names, options
            )
            run.train()
            _compare(provider_cls, run, report)
            if first is None:
                first = (problem, list(names), group)
    if first is None:
        raise ConformanceError(
            f"{provider_cls.__name__}.supports() accepted no parameter of any problem "
            f"({', '.join(p.name for p in problems)}) for any of {[c.label for c in checks]}, "
            "so nothing could be checked: pass problems= with models it supports."
        )
    problem, names, group = first
    probe = [c for c in group if c.mode != "mc"][:1] or group[:1]
    _check_no_gradient(provider_cls, registry, problem, probe, options, report)
    if provider_cls.per_sample:
        _check_failing_statistic(provider_cls, registry, problems, options, report)
    _check_two_cockpits(provider_cls, registry, problem, probe, names, options, report)
    _check_reattach(provider_cls, registry, problem, probe, names, options, report)
    return report


# -- protocol of the class -------------------------------------------------------------------


def _check_class(cls: Any) -> None:
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


def _registry(provider_cls: type[StatisticProvider]) -> Registry:
    """The installed plugins, with ``provider_cls`` serving its name."""
    registry = Registry.from_entry_points()
    entry = registry.providers.get(provider_cls.name)
    if entry is None or entry.cls is not provider_cls:
        registry.providers[provider_cls.name] = ProviderEntry(provider_cls, "<check_provider>", "0")
    return registry


def _supported(
    provider_cls: type[StatisticProvider],
    problem: Problem,
    checks: Sequence[_Check],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> dict[tuple[str, ...], list[_Check]]:
    """Ask ``supports()`` per parameter and check; group the checks by accepted parameters."""
    model = problem.make_model()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    router = StatisticsRouter(
        [p for _, p in named],
        [n for n, _ in named],
        {provider_cls.name: provider_cls},
        provider_cls.name,
        {"chunk_size": options.get("chunk_size")},  # what a Cockpit hands its providers
    )
    groups: dict[tuple[str, ...], list[_Check]] = {}
    try:
        router.attach(model, problem.individual_losses)
        for check in checks:
            accepted = []
            declined = {}
            try:
                routes = router.routes(check.stat.kind)
            except Exception as err:
                raise ConformanceError(
                    f"{provider_cls.__name__}.supports(slot, {check.stat.kind}) raised "
                    f"{type(err).__name__}: {err} on problem '{problem.name}'. supports() must "
                    "answer from the module and its configuration and never raise: return a "
                    "string saying why a parameter is not supported."
                ) from err
            for slot, route in zip(router.slots, routes):
                for _, reason in route.reasons:
                    if not isinstance(reason, str) or not reason.strip():
                        raise ConformanceError(
                            f"{provider_cls.__name__}.supports(<slot {slot.name!r} of "
                            f"{slot.label}>, {check.stat.kind}) returned {reason!r} on problem "
                            f"'{problem.name}': return None when the parameter is supported, "
                            "else a non-empty string saying why not."
                        )
                    declined[slot.name] = reason
                if route.provider is not None:
                    accepted.append(slot.name)
            report.unsupported.setdefault(problem.name, {})[check.label] = declined
            if accepted:
                groups.setdefault(tuple(accepted), []).append(check)
    finally:
        router.close()
    return groups


# -- training with a Cockpit -----------------------------------------------------------------


class _Recorder(Quantity):
    """Keeps every statistic it reads, or the message of a missing one."""

    name = "provider_conformance"

    def __init__(self, stats: Sequence[Statistic], **kwargs: Any):
        super().__init__(**kwargs)
        self.stats = tuple(stats)
        self.seen: dict[int, dict[str, list[Tensor | None] | str]] = {}

    def requirements(self) -> Requirements:  # noqa: D102
        return Requirements(statistics=self.stats)

    def compute(self, ctx: StepContext) -> None:  # noqa: D102
        seen: dict[str, list[Tensor | None] | str] = {}
        for stat in self.stats:
            try:
                values = ctx.stat(stat)
            except UnsupportedModelError as err:
                seen[stat.describe()] = str(err)
                continue
            seen[stat.describe()] = [
                None if v is None else v.detach().clone() if isinstance(v, Tensor) else v
                for v in values
            ]
        self.seen[ctx.step] = seen


@dataclass
class _Snapshot:
    """A tracked step: parameter values before it, the batch and the final gradients."""

    params: dict[str, Tensor]
    x: Tensor
    y: Tensor
    grads: dict[str, Tensor | None]


class _Session:
    """One model trained with one Cockpit on the provider; ``step`` can be interleaved."""

    def __init__(
        self,
        provider_cls: type[StatisticProvider],
        registry: Registry,
        problem: Problem,
        make: Callable[[], torch.nn.Module],
        checks: Sequence[_Check],
        names: Sequence[str],
        options: Mapping[str, Any],
        wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
        what: str = "",
    ):
        self.provider_cls, self.problem, self.make = provider_cls, problem, make
        self.checks = list(checks)
        self.names = list(names)
        self.what = what or f"problem '{problem.name}'"
        self.model = make()
        self.loss_fn = problem.loss_module()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.recorder = _Recorder(
            [c.stat for c in self.checks], schedule=ExplicitSteps(steps=list(TRACKED))
        )
        named = dict(self.model.named_parameters())
        self.cp = Cockpit(
            [(n, named[n]) for n in self.names],
            [self.recorder],
            registry=registry,
            backend=provider_cls.name,
            on_error="raise",
            **options,
        )
        self.cp.attach(self.model, problem.individual_losses)
        self.forward_model = self.model
        if wrap is not None:
            self.forward_model = wrap(self.model)
            self.cp.attach(self.forward_model, problem.individual_losses)
        self.snapshots: dict[int, _Snapshot] = {}
        self._pending: tuple[int, Tensor, Tensor, Tensor, Tensor, dict] | None = None

    def forward(self, step: int) -> None:
        """Forward pass of ``step``."""
        x, y = self.problem.batch(step)
        self.opt.zero_grad()
        before = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        out = self.forward_model(x)
        loss = self.loss_fn(out, y)
        losses = self.problem.individual_losses(out, y).detach()
        self._pending = (step, x, y, loss, losses, before)

    def backward(self) -> None:
        """Backward pass of the pending step inside the Cockpit, then the optimizer step."""
        assert self._pending is not None
        step, x, y, loss, losses, before = self._pending
        self._pending = None
        info = {
            "loss": loss,
            "individual_losses": losses,
            "batch_size": len(x),
            "inputs": x,
            "targets": y,
        }
        try:
            with self.cp(step, info=info):
                loss.backward(retain_graph=self.cp.retain_graph(step))
        except Exception as err:
            raise ConformanceError(
                f"{self.provider_cls.__name__}: training step {step} on {self.what} raised "
                f"{type(err).__name__}: {err}. A provider must never break the user's "
                "backward(): record failed statistics with collection.fail(statistic, "
                "message) and let training go on."
            ) from err
        if step in TRACKED:
            grads = {
                n: None if p.grad is None else p.grad.detach().clone()
                for n, p in self.model.named_parameters()
            }
            self.snapshots[step] = _Snapshot(before, x, y, grads)
        self.opt.step()

    def train(self) -> None:
        """Train :data:`STEPS` steps."""
        for step in range(STEPS):
            self.forward(step)
            self.backward()
        self.cp.close()


# -- references ------------------------------------------------------------------------------


class _Reference:
    """Autograd definitions at one tracked step, on a fresh copy of the model (float64)."""

    def __init__(self, problem: Problem, make: Callable[[], torch.nn.Module], snap: _Snapshot):
        self.problem, self.snap = problem, snap
        self.model = make()
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(snap.params[n])
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]

    @cached_property
    def per_sample(self) -> dict[str, Tensor]:
        """``g_n`` of each parameter, ``[B, *shape]``, by one autograd call per sample."""
        grads = per_sample_gradients(self.model, self.problem, self.snap.x, self.snap.y)
        return dict(zip(self.names, grads))

    def _diagonal(self, matrix: Tensor) -> dict[str, Tensor]:
        diag = matrix.diagonal()
        params = [p for p in self.model.parameters() if p.requires_grad]
        parts = torch.split(diag, [p.numel() for p in params])
        return {n: d.reshape(p.shape) for n, d, p in zip(self.names, parts, params)}

    @cached_property
    def diag_hessian(self) -> dict[str, Tensor]:
        """Diagonal of the explicit Hessian of the mean loss."""
        with math_attention():  # fused attention kernels have no double backward
            hessian = explicit_hessian(self.model, self.problem, self.snap.x, self.snap.y)
        return self._diagonal(hessian)

    @cached_property
    def diag_ggn(self) -> dict[str, Tensor]:
        """Diagonal of the explicit GGN of the mean loss."""
        return self._diagonal(explicit_ggn(self.model, self.problem, self.snap.x, self.snap.y))

    def value(self, check: _Check, name: str) -> Tensor:
        """The reference value of ``check`` for parameter ``name``."""
        if check.mode == "hessian":
            return self.diag_hessian[name]
        if check.mode == "ggn":
            return self.diag_ggn[name]
        g = self.per_sample[name]
        flat = g.flatten(1)
        theta = self.snap.params[name]
        grad = self.snap.grads[name]
        kind = check.stat.kind
        if check.stat is PROJECTIONS:
            return flat @ _directions(grad, theta).flatten(1).T
        if kind == "batch_projection":
            return flat @ grad.flatten()
        if check.stat.fn is not None:  # a per_sample_transform
            return check.stat.fn(g, theta)
        if kind in ("batch_l2", "sum_grad_squared", "batch_dot", "grad_batch"):
            return {
                "batch_l2": lambda: (flat**2).sum(1),
                "sum_grad_squared": lambda: (g**2).sum(0),
                "batch_dot": lambda: flat @ flat.T,
                "grad_batch": lambda: g,
            }[str(kind)]()
        return kind.from_per_sample(DenseGrads(g), check.stat, theta)  # a plugin's kind


# -- comparisons -----------------------------------------------------------------------------


def _label(run: _Session, name: str) -> str:
    owner = run.model
    for part in name.split(".")[:-1]:
        owner = getattr(owner, part)
    return f"'{name}' ({type(owner).__name__})"


def _compare(provider_cls: type[StatisticProvider], run: _Session, report: ProviderReport) -> None:
    """Compare every recorded statistic of ``run`` with its reference."""
    cls = provider_cls.__name__
    for step in TRACKED:
        if step not in run.recorder.seen:
            raise ConformanceError(
                f"{cls}: the Cockpit recorded nothing at tracked step {step} on {run.what}."
            )
        seen = run.recorder.seen[step]
        snap = run.snapshots[step]
        reference = _Reference(run.problem, run.make, snap)
        for check in run.checks:
            values = seen[check.stat.describe()]
            if isinstance(values, str):
                raise ConformanceError(
                    f"{cls}: {check.label} is missing on {run.what} at step {step}, although "
                    f"supports() accepted every parameter of the run ({values}). Fill "
                    "collection.results for every served parameter with a gradient "
                    "(collection.deliver / collection.store), or make supports() return why "
                    "not."
                )
            expected: dict[str, Tensor] = {}
            for i, name in enumerate(run.names):
                value = values[i]
                if snap.grads[name] is None:
                    if value is not None:
                        raise ConformanceError(
                            f"{cls}: {check.label} of parameter {_label(run, name)} on "
                            f"{run.what} at step {step} is {_short(value)}, but the parameter "
                            "got no gradient: leave statistics of parameters whose p.grad is "
                            "None unset (None)."
                        )
                    continue
                if value is None:
                    raise ConformanceError(
                        f"{cls}: {check.label} of parameter {_label(run, name)} on {run.what} "
                        f"at step {step} was not delivered, although supports() accepted it "
                        "and it has a gradient. Deliver it (collection.deliver / "
                        "collection.store) or return a reason from supports()."
                    )
                if check.mode in ("mc", "present"):
                    _check_present(cls, check, run, name, step, value)
                else:
                    expected[name] = reference.value(check, name).detach()
            _check_close(cls, check, run, step, values, expected)
            done = report.checked.setdefault(run.problem.name, {}).setdefault(check.label, [])
            done.extend(n for n in run.names if n not in done)


def _short(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return type(value).__name__


def _check_present(
    cls: str, check: _Check, run: _Session, name: str, step: int, value: Any
) -> None:
    where = f"{check.label} of parameter {_label(run, name)} on {run.what} at step {step}"
    if not isinstance(value, Tensor):
        raise ConformanceError(f"{cls}: {where} is a {type(value).__name__}, not a tensor.")
    if not torch.isfinite(value).all():
        raise ConformanceError(f"{cls}: {where} is not finite.")
    if check.mode == "mc":
        shape = tuple(dict(run.model.named_parameters())[name].shape)
        if tuple(value.shape) != shape:
            raise ConformanceError(
                f"{cls}: {where} has shape {list(value.shape)}, expected the parameter's shape "
                f"{list(shape)}."
            )
        if (value < 0).any():
            raise ConformanceError(
                f"{cls}: {where} has negative entries (min {float(value.min()):.3e}): {check.hint}."
            )


def _check_close(
    cls: str,
    check: _Check,
    run: _Session,
    step: int,
    values: Sequence[Any],
    expected: Mapping[str, Tensor],
) -> None:
    if not expected:
        return
    overall = max(float(e.abs().max()) if e.numel() else 0.0 for e in expected.values())
    for i, name in enumerate(run.names):
        if name not in expected:
            continue
        value, ref = values[i], expected[name]
        where = f"{check.label} of parameter {_label(run, name)} on {run.what} at step {step}"
        if not isinstance(value, Tensor):
            raise ConformanceError(
                f"{cls}: {where} is a {type(value).__name__}; statistics are tensors."
            )
        if tuple(value.shape) != tuple(ref.shape):
            raise ConformanceError(
                f"{cls}: {where} has shape {list(value.shape)}, expected {list(ref.shape)}: "
                f"{check.hint}."
            )
        diff = float((value.detach().to(torch.float64) - ref.to(torch.float64)).abs().max())
        own = float(ref.abs().max()) if ref.numel() else 0.0
        scale = max(own, 1e-6 * overall) or 1.0
        error = diff / scale
        if not error <= TOLERANCE:
            raise ConformanceError(
                f"{cls}: {where} differs from the autograd reference: max error {error:.3e} "
                f"(max |difference| {diff:.3e} relative to the reference's size {scale:.3e}) "
                f"> {TOLERANCE:g}. To fix it: {check.hint}."
            )


# -- further protocol checks ------------------------------------------------------------------


class _WithSpare(torch.nn.Module):
    """A problem's model plus a linear layer its forward pass never uses (no gradient)."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net
        self.spare = extend(torch.nn.Linear(2, 2).double())

    def forward(self, x: Any) -> Tensor:  # noqa: D102
        return self.net(x)


class _Wrapper(torch.nn.Module):
    """Another model owning the same parameters (as DDP or a Lightning module would)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: Any) -> Tensor:  # noqa: D102
        return self.inner(x)


def _check_no_gradient(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problem: Problem,
    probe: Sequence[_Check],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """A tracked parameter without gradient keeps ``None`` (checked in :func:`_compare`)."""
    spare = Problem(
        f"{problem.name}+unused",
        lambda: _WithSpare(problem.make_model()),
        problem.inputs,
        problem.targets,
        problem.batch_size,
        problem.loss,
        problem.seed,
    )
    groups = _supported(provider_cls, spare, probe, options, ProviderReport(provider_cls.name))
    for names, group in groups.items():
        if not any(n.startswith("spare.") for n in names):
            continue
        run = _Session(
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
        _compare(provider_cls, run, report)


def _check_failing_statistic(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problems: Sequence[Problem],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """A transform that raises is reported missing; the other statistics still arrive."""
    good = _Check("batch_l2", BATCH_L2, "per_sample", _PER_SAMPLE_HINT)
    bad = _Check("transform[conformance_failing]", FAILING, "per_sample", "")
    for problem in problems:
        unused = ProviderReport(provider_cls.name)
        groups = _supported(provider_cls, problem, [good, bad], options, unused)
        names = next((n for n, g in groups.items() if len(g) == 2), None)
        if names is not None:
            break
    else:
        return  # supports() accepts batch_l2 and transforms together nowhere: nothing to inject
    run = _Session(
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
                f"{step} (got {_short(value)}): record it with collection.fail(statistic, "
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
    _compare(provider_cls, run, report)


def _check_two_cockpits(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problem: Problem,
    probe: Sequence[_Check],
    names: Sequence[str],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """Two models with a Cockpit each, forward passes interleaved: both values are right."""
    runs = [
        _Session(
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
        _compare(provider_cls, run, report)


def _check_reattach(
    provider_cls: type[StatisticProvider],
    registry: Registry,
    problem: Problem,
    probe: Sequence[_Check],
    names: Sequence[str],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> None:
    """``cp.attach`` of another model owning the same parameters: the values stay right."""
    run = _Session(
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
    _compare(provider_cls, run, report)
