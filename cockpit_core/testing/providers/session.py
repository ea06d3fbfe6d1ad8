"""Training with a provider for :func:`~cockpit_core.testing.check_provider`.

Which parameters ``supports()`` accepts (:func:`supported_params`), and :class:`Session`: one
model trained with one Cockpit on the provider, recording every statistic at the tracked
steps together with what the reference needs (parameters, batch, final gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from cockpit_core.context import StepContext
from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import UnsupportedModelError
from cockpit_core.plugin.registry import ProviderEntry, Registry
from cockpit_core.quantity import Quantity
from cockpit_core.requirements import Requirements
from cockpit_core.schedules import ExplicitSteps
from cockpit_core.statistics.gather import requested_kind
from cockpit_core.statistics.provider import StatisticProvider
from cockpit_core.statistics.router import StatisticsRouter
from cockpit_core.statistics.statistic import Statistic
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.problems import Problem
from cockpit_core.testing.providers.checks import ProviderReport, StatisticCheck

STEPS = 3
TRACKED = (0, 2)
"""Each run trains :data:`STEPS` steps and tracks these (step 1 is untracked in between)."""


def session_registry(provider_cls: type[StatisticProvider]) -> Registry:
    """The installed plugins, with ``provider_cls`` serving its name."""
    registry = Registry.from_entry_points()
    entry = registry.providers.get(provider_cls.name)
    if entry is None or entry.cls is not provider_cls:
        registry.providers[provider_cls.name] = ProviderEntry(provider_cls, "<check_provider>", "0")
    return registry


def supported_params(
    provider_cls: type[StatisticProvider],
    problem: Problem,
    checks: Sequence[StatisticCheck],
    options: Mapping[str, Any],
    report: ProviderReport,
) -> dict[tuple[str, ...], list[StatisticCheck]]:
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
    groups: dict[tuple[str, ...], list[StatisticCheck]] = {}
    try:
        router.attach(model, problem.individual_losses)
        for check in checks:
            accepted = []
            declined = {}
            try:
                routes = router.routes(requested_kind(check.stat))
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
class Snapshot:
    """A tracked step: parameter values before it, the batch and the final gradients."""

    params: dict[str, Tensor]
    x: Tensor
    y: Tensor
    grads: dict[str, Tensor | None]


class Session:
    """One model trained with one Cockpit on the provider; ``step`` can be interleaved."""

    def __init__(
        self,
        provider_cls: type[StatisticProvider],
        registry: Registry,
        problem: Problem,
        make: Callable[[], torch.nn.Module],
        checks: Sequence[StatisticCheck],
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
        self.snapshots: dict[int, Snapshot] = {}
        self._pending: tuple[int, Tensor, Tensor, Tensor, Tensor, dict[str, Tensor]] | None = None

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
            self.snapshots[step] = Snapshot(before, x, y, grads)
        self.opt.step()

    def train(self) -> None:
        """Train :data:`STEPS` steps."""
        for step in range(STEPS):
            self.forward(step)
            self.backward()
        self.cp.close()
