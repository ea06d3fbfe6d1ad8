"""One real tracked step on a copy of the model, for ``cp.check(model, sample=...)``.

``supports()`` answers from a module's type and configuration; some models fail only when
they run (a module fed the batch on another dimension, a parameter also used outside its
module, outputs of the wrong shape). :func:`run_sample_step` runs the Cockpit's quantities
for one step on a deep copy of the model, through a throwaway Cockpit with the same
quantities, providers and options and no log or sinks, and reports what happened: each
quantity's value or error, and per parameter the provider that actually delivered its
statistics, or the messages of the step that say why none did
(:class:`~cockpit_core.check.report.SampleReport`). The user's model, its parameters and
gradients, its optimizer, the user's Cockpit and the global random state stay as they were.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

import torch

from cockpit_core.check.coverage import described
from cockpit_core.check.report import ParamRoute, QuantityOutcome, SampleReport
from cockpit_core.check.sample import Evaluated, SampleSpec, evaluate, leading_size
from cockpit_core.errors import CockpitWarning, MisuseError
from cockpit_core.quantity import Quantity, TwoStepQuantity
from cockpit_core.requirements import Requirements
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.provider import Collection, StatisticProvider
from cockpit_core.statistics.router import StatisticsRouter
from cockpit_core.statistics.statistic import Statistic

Identity = tuple[str, str]


class Probe(Protocol):
    """What :func:`run_sample_step` uses of the throwaway Cockpit."""

    def __call__(self, step: int, *requests: Any, info: Mapping[str, Any] | None = None) -> Any:
        """The ``with`` block of a step (a ``StepRun``)."""

    def retain_graph(self, step: int) -> bool:
        """Whether ``backward`` must keep the graph."""

    def attach(
        self, model: torch.nn.Module, loss_fn: Any = None, *, math_attention: bool = True
    ) -> Any:
        """Attach the model copy."""

    def add(self, quantity: Any) -> Quantity:
        """Track one more quantity."""

    def get_output(self) -> dict[int, dict[str, Any]]:
        """The values tracked."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The quantities' failures."""

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Steps not used, and why."""

    def close(self) -> None:
        """Release hooks."""


MakeProbe = Callable[[list[tuple[str, torch.nn.Parameter]], list[Quantity]], Probe]
"""Builds the throwaway Cockpit from the copied parameters (with names) and quantities."""

NEEDS_LOSSES = (
    "needs info['individual_losses']: let the sample return the per-sample losses [B] "
    "instead of their mean"
)


# -- the probe's quantities ----------------------------------------------------------------


def _every_step(step: int) -> bool:
    return True


def fresh_quantities(quantities: Sequence[Quantity]) -> list[Quantity]:
    """New instances with the same options, active at every step (else deep copies)."""
    out = []
    for q in quantities:
        try:
            fresh = type(q)(q.config, schedule=_every_step)
        except Exception:  # a constructor with more arguments: copy the instance
            fresh = copy.deepcopy(q)
            fresh.schedule = _every_step
        out.append(fresh)
    return out


class FirstStepStatistics(Quantity):
    """What the quantities request at their first step; records nothing.

    Every such statistic is then computed per parameter at the step, also for a quantity
    the check cannot run (e.g. for lack of per-sample losses).
    """

    name = "check_statistics"

    def __init__(self, quantities: Sequence[Quantity]):
        super().__init__(schedule=_every_step)
        stats: dict[Identity, Statistic] = {}
        for q in quantities:
            first = q.start_requirements() if isinstance(q, TwoStepQuantity) else q.requirements()
            stats.update((s.identity, s) for s in first.statistics)
        self.stats = tuple(stats.values())

    def requirements(self) -> Requirements:  # noqa: D102
        return Requirements(statistics=self.stats)

    def compute(self, ctx: Any) -> None:  # noqa: D102
        return None


# -- what happened at the step ---------------------------------------------------------------


class Witness:
    """Watches the probe's providers: who filled which ``(statistic, parameter)``, who failed.

    Each provider's ``collect`` is wrapped (the providers belong to the throwaway Cockpit).
    """

    def __init__(self, providers: Mapping[str, StatisticProvider]):
        self.filled: dict[tuple[Identity, int], str] = {}
        self.failed: dict[Identity, dict[str, str]] = {}
        for name, provider in providers.items():
            # mypy checks the assignment against the unbound @contextmanager method (self too)
            provider.collect = self._watched(name, provider.collect)  # type: ignore[method-assign,assignment]

    def _watched(
        self, name: str, collect: Callable[[Collection], Any]
    ) -> Callable[[Collection], Any]:
        @contextlib.contextmanager
        def watched(collection: Collection) -> Iterator[None]:
            try:
                with collect(collection):
                    yield
            finally:  # the first provider to fill a value is the one the step keeps
                for ident, row in collection.results.items():
                    for i, value in enumerate(row):
                        if value is not None:
                            self.filled.setdefault((ident, i), name)
                for ident, message in collection.missing.items():
                    self.failed.setdefault(ident, {}).setdefault(name, message)

        return watched


class _Counter:
    """Counts the forward passes of the model copy; the batch size from the first one."""

    def __init__(self, model: torch.nn.Module):
        self.calls = 0
        self.batch_size = 0
        self._handle = model.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls += 1
        if not self.batch_size:
            self.batch_size = leading_size((args, kwargs))

    def remove(self) -> None:
        self._handle.remove()


# -- the step ------------------------------------------------------------------------------


def run_sample_step(
    model: torch.nn.Module,
    spec: SampleSpec,
    names: Sequence[str],
    params: Sequence[torch.nn.Parameter],
    quantities: Sequence[Quantity],
    router: StatisticsRouter,
    make_probe: MakeProbe,
    optimizer: Any = None,
    math_attention: bool = False,
) -> tuple[SampleReport, tuple[ParamRoute, ...]]:
    """Run one tracked step of ``quantities`` on a copy of ``model`` with ``spec``'s sample.

    Args:
        model: The user's model (attached to ``router``); it is deep-copied, not run.
        spec: The sample (:func:`~cockpit_core.check.sample.sample_spec`).
        names: The names of the tracked parameters.
        params: The tracked parameters (of ``model``).
        quantities: The Cockpit's quantities (fresh instances run at the step).
        router: The Cockpit's router: its routes, its per-sample loss (for ``torch.func``)
            and its providers, which ignore the copy's passes while the step runs.
        make_probe: Builds the throwaway Cockpit (same providers and options, no log).
        optimizer: The training optimizer; a copy serves the quantities that read it.
        math_attention: Whether the Cockpit runs attention in the math kernel.

    Returns:
        What the step did, and the parameters grouped by the providers that delivered
        their statistics at the step (empty if the step failed).

    """
    devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=devices))
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always", CockpitWarning)
        copied, opt_copy, memo = _copies(model, optimizer)  # with the model's hooks
        for provider in router.providers.values():  # the copy carries the user's hooks too
            if provider.observes_forward:
                stack.enter_context(provider.suspended())
        named = [(n, memo[id(p)]) for n, p in zip(names, params)]
        fresh = fresh_quantities(quantities)
        available = {"loss", "batch_size", "individual_losses"}
        available |= {"inputs", "targets"} if spec.call is None else set()
        available |= {"optimizer"} if opt_copy is not None else set()
        not_run = {q.key: _why_not(q, available) for q in fresh if _needs(q) - available}
        later = [q for q in fresh if "individual_losses" in _needs(q) and q.key not in not_run]
        ready = [q for q in fresh if q.key not in not_run and all(q is not x for x in later)]
        probe = make_probe(named, [*ready, FirstStepStatistics(fresh)])
        counter = _Counter(copied)
        try:
            probe.attach(copied, router.loss_fn, math_attention=math_attention)
            start = len(caught)
            try:
                with torch.enable_grad():
                    evaluated = evaluate(spec, copied)
            finally:
                counter.remove()
            for q in later:  # per-sample losses known now: they can run
                if evaluated.losses is not None:
                    probe.add(q)
                else:
                    not_run[q.key] = NEEDS_LOSSES
            info = _info(evaluated, counter.batch_size, opt_copy)
            run = probe(0, info=info)
            witness = Witness(run.tracker.router.providers)
            with run:
                evaluated.loss.backward(retain_graph=probe.retain_graph(0))
        except Exception as err:  # the model, the sample or a provider's setup raised
            return SampleReport(counter.calls, 0, error=f"{type(err).__name__}: {err}"), ()
        finally:
            probe.close()
        said = [str(e.get("error")) for e in probe.errors]  # by quantities or providers
        said += [m for by in witness.failed.values() for m in by.values()]
        problems = [str(r.get("reason")) for r in probe.skipped]
        problems += list(dict.fromkeys(run.missing.values()))
        report = SampleReport(
            counter.calls,
            int(info["batch_size"]),
            _outcomes(probe, fresh, not_run),
            tuple(problems),
            _notes(caught[start:], said),
        )
        return report, _delivered(router, named, run, witness)


def _copies(model: torch.nn.Module, optimizer: Any) -> tuple[torch.nn.Module, Any, dict[int, Any]]:
    """Deep copies of the model and the optimizer (on the copied parameters), and the memo.

    Raises:
        MisuseError: One of them cannot be deep-copied.

    """
    memo: dict[int, Any] = {}
    copies = []
    for what, obj in (("the model", model), ("the optimizer", optimizer)):
        try:
            copies.append(copy.deepcopy(obj, memo))  # one memo: the optimizer gets the copies
        except Exception as err:
            raise MisuseError(
                f"cp.check(model, sample=...) runs its step on a deep copy, and {what} cannot "
                f"be deep-copied ({type(err).__name__}: {err})."
            ) from err
    return copies[0], copies[1], memo


def _needs(q: Quantity) -> frozenset[str]:
    """The ``info`` keys ``q`` needs (none if asking raises: the step reports that)."""
    try:
        return frozenset(q.required_info())
    except Exception:  # plugin code
        return frozenset()


def _why_not(q: Quantity, available: set[str]) -> str:
    missing = sorted(_needs(q) - available)
    keys = ", ".join(f"info['{k}']" for k in missing)
    hints = {
        "optimizer": "pass optimizer= to cp.check",
        "inputs": "pass the sample as a batch, not a callable",
        "targets": "pass the sample as a batch (inputs, targets)",
    }
    fix = "; ".join(dict.fromkeys(hints[k] for k in missing if k in hints))
    return f"needs {keys}" + (f": {fix}" if fix else ", which cp.check cannot give it")


def _info(evaluated: Evaluated, batch_size: int, optimizer: Any) -> dict[str, Any]:
    """The step's ``info``; ``batch_size``: from the forward pass if the sample said none."""
    info: dict[str, Any] = {
        "loss": evaluated.loss,
        "batch_size": evaluated.batch_size or batch_size,
    }
    if evaluated.losses is not None:
        info["individual_losses"] = evaluated.losses.detach()
    if evaluated.inputs is not None:
        info["inputs"] = evaluated.inputs
    if evaluated.targets is not None:
        info["targets"] = evaluated.targets
    if optimizer is not None:
        info["optimizer"] = optimizer
    return info


def _outcomes(
    probe: Probe, fresh: Sequence[Quantity], not_run: Mapping[str, str]
) -> tuple[QuantityOutcome, ...]:
    """What each quantity did at the step (in the Cockpit's order)."""
    output = probe.get_output().get(0, {})
    errors: dict[str, str] = {}
    for record in probe.errors:
        errors.setdefault(str(record.get("quantity")), str(record.get("error")))
    skipped = {str(k): str(r.get("reason")) for r in probe.skipped for k in r.get("quantities", ())}
    out = []
    for q in fresh:
        key = q.key
        if key in not_run:
            out.append(QuantityOutcome(key, "not run", not_run[key]))
        elif key in errors:
            out.append(QuantityOutcome(key, "error", errors[key]))
        elif key in skipped:
            out.append(QuantityOutcome(key, "not run", f"the step was skipped: {skipped[key]}"))
        elif key in output:
            out.append(QuantityOutcome(key, "value"))
        elif q.two_step:
            out.append(QuantityOutcome(key, "started", "its value comes at the next tracked step"))
        else:
            out.append(QuantityOutcome(key, "no value", "it recorded nothing at this step"))
    return tuple(out)


def _notes(caught: Sequence[warnings.WarningMessage], said: Sequence[str]) -> tuple[str, ...]:
    """The step's cockpit warnings, less those that repeat what the report says already."""
    notes = []
    for w in caught:
        text = str(w.message).removeprefix("cockpit: ")
        if issubclass(w.category, CockpitWarning) and not any(m in text for m in said):
            notes.append(text)
    return tuple(dict.fromkeys(notes))


def _delivered(
    router: StatisticsRouter,
    named: Sequence[tuple[str, torch.nn.Parameter]],
    run: Any,
    witness: Witness,
) -> tuple[ParamRoute, ...]:
    """The parameters grouped by who delivered their statistics at the step, with notes.

    Kinds come from the step's statistics; the reasons why providers tried first cannot
    serve a parameter come from the user's router (the copy routes the same way).
    """
    stats: Sequence[Statistic] = run.merged.statistics
    # (providers, reasons, notes) -> (names, how)
    groups: dict[
        tuple[tuple[tuple[str, str | None], ...], tuple[tuple[str, str], ...], tuple[str, ...]],
        tuple[list[str], list[tuple[str, str, str]]],
    ] = {}
    for i, (name, p) in enumerate(named):
        if not p.requires_grad or not stats:
            continue
        kinds: dict[str, set[str | None]] = {}
        notes: list[str] = []
        for stat in stats:
            got = witness.filled.get((stat.identity, i))
            stat_kind = cast(StatisticKind, stat.kind)  # Requirements admits resolved kinds only
            planned = router.routes(stat_kind)[i].provider
            if p.grad is None:
                got = planned
            elif got is None:
                notes.extend(_missing_notes(name, stat, run.missing, witness))
            elif got != planned and planned is not None:
                why = _naming(name, witness.failed.get(stat.identity, {}).get(planned, ""))
                notes.append(
                    f"{planned} left it empty at the step{f' ({why})' if why else ''}; {got} "
                    "recomputed it (another forward and backward pass)"
                )
            kinds.setdefault(str(stat_kind), set()).add(got)
        if p.grad is None:
            notes.append("no gradient at the sample step (its forward pass did not use it)")
        served = tuple((kind, _one(found)) for kind, found in kinds.items())
        reasons = tuple(
            dict.fromkeys(r for s in stats for r in router.reasons(cast(StatisticKind, s.kind), i))
        )
        group = groups.setdefault((served, reasons, tuple(dict.fromkeys(notes))), ([], []))
        group[0].append(name)
        # how the copy's providers served it at the step (e.g. where a broadcast was captured)
        group[1].extend(described(run.tracker.router, i, [provider for _, provider in served]))
    return tuple(ParamRoute(tuple(n), s, r, tuple(h), t) for (s, r, t), (n, h) in groups.items())


def _one(found: set[str | None]) -> str | None:
    """The provider of a kind: ``None`` if any of its statistics is missing."""
    providers = sorted(p for p in found if p is not None)
    return providers[0] if providers and len(providers) == len(found) else None


def _naming(name: str, message: str) -> str:
    """``message`` if it names parameter ``name`` (or names no parameter), else ``""``."""
    return message if f"'{name}'" in message or "'" not in message else ""


def _missing_notes(
    name: str, stat: Statistic, missing: Mapping[Identity, str], witness: Witness
) -> list[str]:
    """Why ``stat`` is missing for parameter ``name``.

    The providers' own messages that name it, else the step's message for the statistic.
    """
    failed = witness.failed.get(stat.identity, {})
    own = [f"{provider}: {m}" for provider, m in failed.items() if f"'{name}'" in m]
    if own:
        return own
    message = missing.get(stat.identity)
    return [f"{stat.describe()}: {message}"] if message else [f"no {stat.describe()} delivered"]
