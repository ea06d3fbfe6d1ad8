"""Which provider computes which statistic of which parameter, and the merged result.

For every tracked parameter and requested kind, the router asks the installed providers
(in the order of ``backend``: ``"auto"`` sorts them by their ``cost``) whether they can
deliver it, and the first that can serves it. The answer is cached until the model
changes (``cp.attach``). At a step, every provider receives one
:class:`~cockpit_core.statistics.provider.Collection` with what it serves; after
``backward()`` the results are merged, parameters a provider left empty are handed to a
provider that recomputes the pass (``torch.func``) where one can serve them, and every
statistic some parameter did not receive is reported with the reasons.

Requests (objects the user passes to ``cp(step, *requests)``, e.g. BackPACK extensions) go
to the first installed provider that :meth:`~StatisticProvider.accepts` them; a provider
that observes the forward pass is armed for every parameter from its first request on.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cockpit_core.errors import CockpitWarning, ConfigError, MisuseError
from cockpit_core.quantity import validate_config
from cockpit_core.requirements import MergedRequirements
from cockpit_core.statistics.gather import StepCollection, requested_kind
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.messages import MODEL_HINT, name_list
from cockpit_core.statistics.provider import ParamSlot, StatisticProvider
from cockpit_core.statistics.statistic import Statistic

Identity = tuple[str, str]

Plan = tuple[dict[str, dict[Identity, frozenset[int]]], dict[Identity, list[int]]]
"""``(served, unrouted)`` of :meth:`StatisticsRouter.plan`."""
Results = dict[Identity, list[Any]]


@dataclass(frozen=True)
class Route:
    """How one ``(parameter, kind)`` is served.

    Attributes:
        provider: The provider that serves it, or ``None`` if none can.
        reasons: Why each provider tried before it (or every provider) cannot.

    """

    provider: str | None
    reasons: tuple[tuple[str, str], ...] = ()


def owners(model: torch.nn.Module) -> dict[int, list[tuple[str, torch.nn.Module, str]]]:
    """``id(parameter) -> [(module name, module, attribute)]`` of every module registering it."""
    out: dict[int, list[tuple[str, torch.nn.Module, str]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, p in module.named_parameters(recurse=False):
            entries = out.setdefault(id(p), [])
            if not any(m is module for _, m, _ in entries):
                entries.append((name, module, attr))
    return out


def order(
    providers: Mapping[str, type[StatisticProvider]], backend: str | Sequence[str]
) -> list[str]:
    """Provider names in the order the router tries them.

    Raises:
        ConfigError: ``backend`` names a provider that is not installed.

    """
    if backend == "auto":
        return sorted(providers, key=lambda n: (providers[n].cost, n))
    names = [backend] if isinstance(backend, str) else list(backend)
    unknown = [n for n in names if n not in providers]
    if unknown or not names:
        installed = ", ".join(sorted(providers)) or "none"
        raise ConfigError(
            [
                (
                    "backend",
                    f"unknown statistics provider(s) {unknown}: use 'auto' or installed "
                    f"providers ({installed}; `cockpit plugins` lists them)",
                )
            ]
        )
    return names


class StatisticsRouter:
    """The Cockpit's source of statistics: every installed provider, routed per parameter.

    Args:
        params: The tracked parameters.
        names: Their names.
        providers: Provider classes by name (from the plugins' ``register_statistic_providers``).
        backend: ``"auto"``, a provider name, or provider names in order of preference.
        options: Options handed to every provider (e.g. ``chunk_size``).
        provider_options: Each provider's own options, by provider name (validated
            against its ``options_model``).

    Raises:
        ConfigError: An unknown backend or provider name, or invalid provider options.

    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        providers: Mapping[str, type[StatisticProvider]],
        backend: str | Sequence[str] = "auto",
        options: Mapping[str, Any] | None = None,
        provider_options: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        own = provider_own_options(providers, provider_options or {})
        self.params = list(params)
        self.names = list(names)
        self.backend = backend
        self.order = order(providers, backend)
        # every installed provider exists (observers must step aside while another provider
        # recomputes the pass, and stay disarmed); only those of ``order`` serve statistics
        names = self.order + sorted(n for n in providers if n not in self.order)
        self.providers: dict[str, StatisticProvider] = {
            name: providers[name](self.params, self.names, {**(options or {}), **own.get(name, {})})
            for name in names
        }
        self.model: torch.nn.Module | None = None
        self.loss_fn: Any = None
        self.slots = [ParamSlot(i, n, p) for i, (n, p) in enumerate(zip(self.names, self.params))]
        self._routes: dict[str, list[Route]] = {}
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self.warned: set[str] = set()  # providers whose fallback use was warned about
        self.requested: set[str] = set()  # got requests: armed for every parameter from then on
        self.checked: tuple[int, float, float] | None = None

    def take_per_sample_check(self) -> tuple[int, float, float] | None:
        """The last collection's per-sample-mean check (index, ratio, residual), once.

        See :mod:`cockpit_core.statistics.gather`: ``None`` when nothing was compared.
        """
        checked, self.checked = self.checked, None
        return checked

    # -- the model ----------------------------------------------------------------------

    def attach(self, model: torch.nn.Module, loss_fn: Any = None) -> None:
        """Know the model (owners of the parameters) and, optionally, a per-sample loss.

        Raises:
            MisuseError: ``model`` does not own every tracked parameter.

        """
        found = owners(model)
        foreign = [n for n, p in zip(self.names, self.params) if id(p) not in found]
        if foreign:
            raise MisuseError(
                f"cp.attach: the model does not own the tracked parameter(s) {foreign}. Attach "
                "the model whose parameters were given to Cockpit(...)."
            )
        self.slots = []
        for i, (n, p) in enumerate(zip(self.names, self.params)):
            entries = found[id(p)]
            module_name, module, attr = entries[0]
            self.slots.append(ParamSlot(i, n, p, module, module_name, attr, len(entries) > 1))
        self.model, self.loss_fn = model, loss_fn
        for provider in self.providers.values():
            provider.attach(model, loss_fn)
        self._routes, self._plans = {}, {}

    # -- routing ------------------------------------------------------------------------

    def routes(self, kind: StatisticKind) -> list[Route]:
        """How each parameter gets statistics of ``kind`` (cached until the model changes)."""
        if kind not in self._routes:
            table = []
            for slot in self.slots:
                reasons = []
                chosen = None
                for name in self.order:
                    provider = self.providers[name]
                    if provider.delivers(kind):
                        reason = provider.supports(slot, kind)
                    else:
                        reason = f"computes no {kind}"
                    if reason is None:
                        chosen = name
                        break
                    reasons.append((name, reason))
                table.append(Route(chosen, tuple(reasons)))
            self._routes[str(kind)] = table
        return self._routes[str(kind)]

    def plan(self, statistics: Sequence[Statistic]) -> Plan:
        """Which provider serves which parameters of each statistic.

        Returns:
            ``(served, unrouted)``: per provider the parameter indices of each statistic,
            and per statistic the indices no provider can serve. Parameters that need no
            gradient are skipped. Remembered until the routes or ``requires_grad`` flags
            change (do not modify it).

        """
        key = (
            tuple((stat.identity, str(requested_kind(stat))) for stat in statistics),
            tuple(p.requires_grad for p in self.params),
        )
        known = self._plans.get(key)
        if known is None:
            known = self._plans[key] = self._plan(statistics)
        return known

    def _plan(self, statistics: Sequence[Statistic]) -> Plan:
        served: dict[str, dict[Identity, set[int]]] = {}
        unrouted: dict[Identity, list[int]] = {}
        for stat in statistics:
            for i, route in enumerate(self.routes(requested_kind(stat))):
                if not self.params[i].requires_grad:
                    continue
                if route.provider is None:
                    unrouted.setdefault(stat.identity, []).append(i)
                else:
                    served.setdefault(route.provider, {}).setdefault(stat.identity, set()).add(i)
        return (
            {n: {k: frozenset(v) for k, v in t.items()} for n, t in served.items()},
            unrouted,
        )

    # -- the forward pass ---------------------------------------------------------------

    def observers(self, statistics: Sequence[Statistic]) -> dict[str, frozenset[int]]:
        """Observing providers, each with the parameters it serves for ``statistics``.

        An empty set means: disarm (nothing to observe at such a step). A provider that
        received requests (:meth:`request`) observes every parameter, at every step.
        """
        served = self.plan(statistics)[0]
        everything = frozenset(range(len(self.params)))
        return {
            name: everything
            if name in self.requested
            else frozenset().union(*served.get(name, {}).values())
            for name, provider in self.providers.items()
            if provider.observes_forward
        }

    def arm(self, statistics: Sequence[Statistic]) -> bool:
        """Arm the observing providers for a forward pass of a step with ``statistics``.

        A provider that raises (even ``SystemExit``) is reported and left as it is: the
        statistics it then misses are reported at the step, training goes on.

        Returns:
            Whether some provider will observe the forward pass.

        """
        observing = False
        for name, indices in self.observers(statistics).items():
            _contained(name, "arm", self.providers[name].arm, indices)
            observing = observing or bool(indices)
        return observing

    def unobserved(self, statistics: Sequence[Statistic]) -> list[str]:
        """Observing providers that needed the last forward pass but were not armed for it."""
        return [
            name
            for name, indices in self.observers(statistics).items()
            if indices and not self.providers[name].armed(indices)
        ]

    # -- requests -----------------------------------------------------------------------

    def route_requests(
        self, requests: Iterable[Any], where: str = "cp(step, ...)"
    ) -> dict[str, tuple[Any, ...]]:
        """Each request to the first installed provider that accepts it, in the user's order.

        Every installed provider is asked, those of ``backend`` first: ``backend`` chooses
        who computes the quantities' statistics, while a request names what it is.

        Args:
            requests: The objects passed after the step number.
            where: The call, for the message (``"cp(3, ...)"``).

        Raises:
            MisuseError: No installed provider accepts some request.

        """
        routed: dict[str, list[Any]] = {}
        for request in requests:
            name = next((n for n, p in self.providers.items() if _accepts(p, request)), None)
            if name is None:
                raise MisuseError(self.unaccepted_message(request, where))
            routed.setdefault(name, []).append(request)
        return {n: tuple(r) for n, r in routed.items()}

    def unaccepted_message(self, request: Any, where: str = "cp(step, ...)") -> str:
        """Why ``request`` is refused: no installed provider accepts it, and what to do."""
        installed = ", ".join(f"'{n}'" for n in self.providers) or "none"
        kind = "a class" if isinstance(request, type) else f"type {type(request).__name__}"
        hint = ""
        if isinstance(request, Mapping):
            hint = (
                " A dict after the step: pass the step's info as a keyword, cp(step, info={...})."
            )
        elif isinstance(request, type):
            hint = f" It is a class: pass an instance, e.g. {request.__name__}()."
        return (
            f"{where}: no installed statistics provider accepts the argument {_short(request)} "
            f"({kind}; installed providers: {installed}).{hint} Arguments "
            "after the step number are requests for a provider, e.g. BackPACK extensions such "
            "as DiagGGNExact(), which need the BackPACK provider: pip install cockpit-backpack "
            "(`cockpit plugins` lists what is installed)."
        )

    def request(
        self, requests: Iterable[Any], where: str = "cp(step, ...)"
    ) -> tuple[dict[str, tuple[Any, ...]], list[str]]:
        """Route ``requests`` and keep their providers armed for every parameter from now on.

        Call it before anything else arms providers at a step: whether a provider was
        armed tells whether it observed the forward pass that already ran.

        Returns:
            ``(routed, late)``: the requests per provider, and the providers that observe
            the forward pass, receive requests for the first time, and were not armed for
            the last forward pass (their requests cannot be served at this step).

        Raises:
            MisuseError: No installed provider accepts some request.

        """
        routed = self.route_requests(requests, where)
        everything = frozenset(range(len(self.params)))
        late = []
        for name in routed:
            provider = self.providers[name]
            if name in self.requested or not provider.observes_forward:
                continue
            if not provider.armed(everything):
                late.append(name)
            _contained(name, "arm", provider.arm, everything)
        self.requested.update(routed)
        return routed, late

    # -- a step -------------------------------------------------------------------------

    def collect(
        self,
        merged: MergedRequirements,
        batch_size: int,
        info: Mapping[str, Any] | None = None,
        eager: bool = False,
        samples: int | None = None,
        loss_scale: float = 1.0,
        requests: Sequence[Any] = (),
    ) -> contextlib.AbstractContextManager[tuple[Results, dict[Identity, str]]]:
        """Run the user's ``backward()`` inside; statistics are complete after the block.

        Args:
            merged: The step's statistics.
            batch_size: Samples of the mean loss (see :class:`~cockpit_core.statistics.provider.Collection`).
            info: The step's ``info``.
            eager: Whether projections may be formed during ``backward``.
            samples: Samples in this backward pass, if fewer (a micro-batch).
            loss_scale: The factor the backpropagated loss was multiplied by (GradScaler).
            requests: Objects for the providers that accept them (``cp(step, *requests)``):
                each such provider enters the step, with or without statistics.

        After the block, :attr:`checked` holds ``(index, ratio, residual)`` of one
        parameter's ``p.grad`` against the mean of its per-sample gradients, ``p.grad ~
        ratio * mean`` (``None`` when not checked: several processes, micro-batches).

        Yields:
            ``(statistics, missing)``: ``statistics[identity][i]`` for parameter ``i``,
            and after the block ``missing[identity]``, a message for each statistic that
            some parameters (with a gradient) did not receive.

        Raises:
            MisuseError: A statistic needs the model, and none was attached, or no
                provider accepts a request.

        """
        self.checked = None
        step = StepCollection(
            self,
            merged.statistics,
            batch_size,
            info or {},
            samples,
            loss_scale,
            requests=self.route_requests(requests),
            owners=merged.owners,
        )
        return step.run(eager)

    def require_model(
        self, stats: Sequence[Statistic], unrouted: dict[Identity, list[int]]
    ) -> None:
        """Raise :class:`MisuseError` if a statistic is unrouted only for lack of a model."""
        if self.model is not None or not unrouted:
            return
        by_ident = {s.identity: s for s in stats}
        ident, indices = next(iter(unrouted.items()))
        route = self.routes(requested_kind(by_ident[ident]))[indices[0]]
        reasons = "; ".join(f"{n}: {r}" for n, r in route.reasons) or "no provider installed"
        raise MisuseError(
            f"No statistics provider can compute {by_ident[ident].describe()} without the "
            f"model ({reasons}). To fix it, {MODEL_HINT}"
        )

    def unrouted_message(self, stat: Statistic, indices: list[int]) -> str:
        """Why no provider serves ``stat`` for the parameters ``indices`` (grouped by reason)."""
        kind = requested_kind(stat)
        groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
        for i in indices:
            groups.setdefault(self.reasons(kind, i), []).append(self.slots[i].name)
        text = []
        for reasons, names in groups.items():
            why = (
                "; ".join(f"{n}: {r}" for n, r in reasons) or "no statistics provider is installed"
            )
            text.append(f"{name_list(names, len(self.params))} ({why})")
        delivered = any(self.providers[n].delivers(kind) for n in self.order)
        hint = "" if delivered else getattr(stat.kind, "install_hint", "")
        return (
            f"No installed provider computes {stat.describe()} for "
            + "; ".join(text)
            + "."
            + (f" Hint: {hint}." if hint else "")
        )

    def reasons(self, kind: StatisticKind, index: int) -> tuple[tuple[str, str], ...]:
        """Why providers cannot serve ``kind`` for parameter ``index``.

        Only providers that compute the kind at all are listed, or every provider if none
        does.
        """
        route = self.routes(kind)[index]
        relevant = tuple((n, r) for n, r in route.reasons if self.providers[n].delivers(kind))
        return relevant or route.reasons

    # -- reporting ----------------------------------------------------------------------

    def describe(self, stat: Statistic) -> tuple[str, str]:
        """``(how, problem)`` for ``stat`` on the attached model (``problem`` empty: ok)."""
        kind = requested_kind(stat)
        routes = [r for r, p in zip(self.routes(kind), self.params) if p.requires_grad]
        used = list(dict.fromkeys(r.provider for r in routes if r.provider is not None))
        how = ", ".join(used) if used else "no provider"
        orphans = [i for i, r in enumerate(self.routes(kind)) if r.provider is None]
        return how, self.unrouted_message(stat, orphans) if orphans else ""

    def close(self) -> None:
        """Close every provider (one that raises is reported; the others are still closed)."""
        for name, provider in self.providers.items():
            if provider.observes_forward:
                _contained(name, "disarm", provider.arm, frozenset())
            _contained(name, "close", provider.close)


def _accepts(provider: StatisticProvider, request: Any) -> bool:
    """``provider.accepts(request)``; a provider whose ``accepts`` raises does not accept it."""
    try:
        return bool(provider.accepts(request))
    except Exception:  # plugin code: another provider may accept it, else the user is told
        return False


def _short(obj: Any, limit: int = 80) -> str:
    """``repr(obj)``, cut to ``limit`` characters."""
    try:
        text = repr(obj)
    except Exception:  # a broken __repr__ must not hide the actual problem
        text = f"<{type(obj).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _contained(name: str, action: str, call: Any, *args: Any) -> None:
    """Run a provider's ``call(*args)``; warn instead of raising (``KeyboardInterrupt`` passes)."""
    try:
        call(*args)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as err:  # plugin code (even SystemExit) must not stop training
        warnings.warn(
            f"cockpit: statistics provider {name!r} failed to {action}: "
            f"{type(err).__name__}: {err}; training continues, and statistics it misses are "
            "reported at the steps that need them.",
            CockpitWarning,
            stacklevel=3,
        )


def provider_own_options(
    providers: Mapping[str, type[StatisticProvider]],
    provider_options: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """``provider_options`` validated against each provider's ``options_model``.

    Raises:
        ConfigError: Every unknown provider name (with the installed ones) and every
            invalid option, with its path ``provider_options.<provider>.<option>``.

    """
    errors: list[tuple[str, str]] = []
    own: dict[str, dict[str, Any]] = {}
    for name, options in provider_options.items():
        path = f"provider_options.{name}"
        cls = providers.get(name)
        if cls is None:
            installed = ", ".join(sorted(providers)) or "none"
            errors.append((path, f"no installed statistics provider '{name}' ({installed})"))
            continue
        if cls.options_model is None:
            if options:
                errors.append((path, f"the provider '{name}' takes no options"))
            continue
        try:
            validated = validate_config(cls.options_model, dict(options), prefix=path)
        except ConfigError as err:
            errors.extend(err.errors)
            continue
        own[name] = validated.model_dump(exclude_unset=True)
    if errors:
        raise ConfigError(errors)
    return own
