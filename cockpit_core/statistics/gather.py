"""One step's collection: every provider around the user's ``backward()``, then the merge.

:meth:`StatisticsRouter.collect <cockpit_core.statistics.router.StatisticsRouter.collect>`
builds a :class:`StepCollection`: one :class:`~cockpit_core.statistics.provider.Collection`
per provider that serves something at the step (statistics, or requests passed to
``cp(step, *requests)``), entered around ``backward()`` (providers
that recompute the pass exit last, with the others' hooks suspended). Afterwards the
results are merged, parameters a provider left empty go to a provider that recomputes the
pass where one can serve them (with a warning, once), every statistic some parameter did
not receive is reported with the reasons, and one parameter's ``p.grad`` is compared with
the mean of its per-sample gradients (:attr:`StatisticsRouter.checked`).

The comparison runs for every per-sample provider, those that recompute the pass
included: each of these gets a parameter of its own to check (the smallest it serves). A
recomputed pass whose per-sample mean points elsewhere than ``p.grad`` (other dropout
masks, state that changed between calls: :mod:`cockpit_core.statistics.mean_check`) loses
its statistics at the step, with that reason, instead of delivering those of another
network; a mere scale (a loss that is not a mean) goes to the loop check's warning as for
any provider.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

import torch

from cockpit_core.errors import CockpitWarning
from cockpit_core.statistics import mean_check
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.messages import MODEL_HINT, name_list
from cockpit_core.statistics.provider import Collection, ParamSlot, StatisticProvider
from cockpit_core.statistics.statistic import Statistic

Identity = tuple[str, str]
Results = dict[Identity, list[Any]]


def requested_kind(stat: Statistic) -> StatisticKind:
    """``stat.kind`` of a requested statistic, typed as the kind object it is.

    ``Statistic.kind`` may hold a plain name, but
    :class:`~cockpit_core.requirements.Requirements` refuses a statistic whose name is no
    kind, so every statistic that reaches the router holds a :class:`StatisticKind`
    (nothing is checked or converted here).
    """
    return cast(StatisticKind, stat.kind)


class Router(Protocol):
    """What a :class:`StepCollection` reads of its router, and the check it leaves there.

    :class:`~cockpit_core.statistics.router.StatisticsRouter` satisfies it; the router builds
    on this module (it starts every step's collection), so this module names only the
    members it uses.
    """

    checked: tuple[int, float, float] | None
    """``(index, ratio, residual)`` of the last per-sample-mean check, or ``None``."""

    @property
    def params(self) -> Sequence[torch.nn.Parameter]:
        """The tracked parameters."""
        ...

    @property
    def names(self) -> Sequence[str]:
        """Their names."""
        ...

    @property
    def slots(self) -> Sequence[ParamSlot]:
        """Each parameter's slot (name, module, attribute)."""
        ...

    @property
    def providers(self) -> Mapping[str, StatisticProvider]:
        """Every installed provider, by name."""
        ...

    @property
    def order(self) -> Sequence[str]:
        """The names of the providers that serve statistics, in the order they are tried."""
        ...

    @property
    def model(self) -> torch.nn.Module | None:
        """The attached model, if any."""
        ...

    @property
    def warned(self) -> set[str]:
        """Providers whose use as a fallback was warned about (added to here)."""
        ...

    def plan(
        self, statistics: Sequence[Statistic]
    ) -> tuple[dict[str, dict[Identity, frozenset[int]]], dict[Identity, list[int]]]:
        """``(served, unrouted)``: which provider serves which parameters of each statistic."""
        ...

    def require_model(
        self, stats: Sequence[Statistic], unrouted: dict[Identity, list[int]]
    ) -> None:
        """Raise if a statistic is unrouted only for lack of a model."""
        ...

    def unrouted_message(self, stat: Statistic, indices: list[int]) -> str:
        """Why no provider serves ``stat`` for the parameters ``indices``."""
        ...


class StepCollection:
    """The statistics of one backward pass, from every provider that serves some of them."""

    def __init__(
        self,
        router: Router,
        stats: Sequence[Statistic],
        batch_size: int,
        info: Mapping[str, Any],
        samples: int | None,
        loss_scale: float,
        requests: Mapping[str, tuple[Any, ...]] | None = None,
        owners: Mapping[Identity, tuple[str, ...]] | None = None,
    ):
        self.router = router
        self.stats = tuple(stats)
        self.requests = dict(requests or {})  # provider name -> the requests it accepted
        self.owners = dict(owners or {})
        self.batch_size, self.info = batch_size, info
        self.samples, self.loss_scale = samples, loss_scale
        self.served, self.unrouted = router.plan(self.stats)
        self.results: Results = {s.identity: [None] * len(router.params) for s in self.stats}
        self.collections: dict[str, Collection] = {}
        self.eager = False

    def collection(
        self,
        targets: dict[Identity, frozenset[int]],
        eager: bool,
        requests: tuple[Any, ...] = (),
    ) -> Collection:
        """A :class:`Collection` of this step for the given parameters of each statistic."""
        return Collection(
            statistics=tuple(s for s in self.stats if s.identity in targets),
            targets=targets,
            slots=self.router.slots,
            batch_size=self.batch_size,
            info=self.info,
            eager=eager,
            grad_of_batch=self.eager,
            samples=self.samples,
            loss_scale=self.loss_scale,
            requests=requests,
            owners=self.owners,
            pooling=True,
        )

    @contextlib.contextmanager
    def run(self, eager: bool) -> Iterator[tuple[Results, dict[Identity, str]]]:
        """Context around ``backward()``; yields ``(statistics, missing)`` (see ``collect``)."""
        router = self.router
        router.require_model(self.stats, self.unrouted)
        missing: dict[Identity, str] = {}
        self.eager = eager  # one process, whole batch: p.grad is this pass's gradient
        names = [*self.served, *(n for n in self.requests if n not in self.served)]
        self.collections = {
            name: self.collection(self.served.get(name, {}), eager, self.requests.get(name, ()))
            for name in names
        }
        checks = self._check_targets() if eager else {}
        for name, index in checks.items():
            self.collections[name].check_index = index
        with contextlib.ExitStack() as stack:
            # providers that recompute the pass run theirs last, with the others' hooks off
            for name in sorted(self.collections, key=lambda n: not router.providers[n].recomputes):
                stack.enter_context(self._guarded(name, self.collections[name]))
            yield self.results, missing
        rejected = self._reject_recomputed(checks)
        for col in self.collections.values():
            self._merge(col)
        self._fall_back()
        missing.update(self._missing())
        router.checked = self._checked(checks, rejected)

    def _merge(self, col: Collection) -> set[int]:
        """Copy ``col``'s values into the results where they are still empty."""
        filled = set()
        for ident, row in col.results.items():
            if ident not in self.results:
                continue
            for i, value in enumerate(row):
                if value is not None and self.results[ident][i] is None:
                    self.results[ident][i] = value
                    filled.add(i)
        return filled

    def _check_targets(self) -> dict[str, int]:
        """Per provider, the parameter whose per-sample mean is compared with ``p.grad``.

        The smallest parameter any provider that reads the user's pass serves (one check
        for all of them, as the loop check needs one), and for every provider that
        recomputes the pass the smallest parameter it serves.
        """
        router = self.router
        best: tuple[int, str, int] | None = None
        recomputing: dict[str, tuple[int, int]] = {}
        for stat in self.stats:
            if not stat.per_sample:
                continue
            for name, table in self.served.items():
                provider = router.providers[name]
                if not provider.per_sample:
                    continue
                for i in table.get(stat.identity, ()):
                    size = router.params[i].numel()
                    if provider.recomputes:
                        if name not in recomputing or size < recomputing[name][0]:
                            recomputing[name] = (size, i)
                    elif best is None or size < best[0]:
                        best = (size, name, i)
        out = {name: i for name, (_, i) in recomputing.items()}
        if best is not None:
            out[best[1]] = best[2]
        return out

    def _reject_recomputed(self, checks: Mapping[str, int]) -> set[str]:
        """Drop the statistics of recomputing providers whose per-sample mean misses ``p.grad``.

        Returns:
            The providers whose statistics were dropped.

        """
        router, rejected = self.router, set()
        for name, index in checks.items():
            col = self.collections[name]
            grad = router.params[index].grad
            if not router.providers[name].recomputes or col.check_mean is None or grad is None:
                continue
            off = float(mean_check.residual(grad, col.check_mean))
            if off <= mean_check.floor(grad):
                continue
            # the core does not know the precision of the user's pass (autocast) nor of
            # the provider's: a half-precision tolerance, far below another network's miss
            tol = max(mean_check.tolerance(grad), mean_check.LOOSEST)
            if off <= tol:
                continue
            rejected.add(name)
            message = mean_check.mismatch_message(
                f"The '{name}' provider", [router.names[index]], off, tol
            )
            col.results.clear()
            for stat in col.statistics:
                col.missing[stat.identity] = message
        return rejected

    def _checked(
        self, checks: Mapping[str, int], rejected: set[str]
    ) -> tuple[int, float, float] | None:
        """The per-sample-mean check for the loop check (:attr:`StatisticsRouter.checked`).

        That of the providers reading the user's pass; else the smallest parameter of a
        recomputing provider whose statistics were kept.
        """
        router = self.router
        order = sorted(
            (n for n in checks if n not in rejected),
            key=lambda n: (router.providers[n].recomputes, router.params[checks[n]].numel()),
        )
        for name in order:
            index = checks[name]
            compared = _compare(index, router.params[index].grad, self.collections[name].check_mean)
            if compared is not None or not router.providers[name].recomputes:
                return compared
        return None

    @contextlib.contextmanager
    def _guarded(self, name: str, col: Collection) -> Iterator[None]:
        """``provider.collect(col)``; a provider that raises after backward loses its statistics.

        Exceptions while it sets up (``MisuseError``, ``MissingInfoError``) reach the user;
        any other ``BaseException`` of the plugin (``SystemExit``), at setup or after
        ``backward``, costs only its statistics.
        """
        provider = self.router.providers[name]
        ctx: contextlib.AbstractContextManager[None] | None = None
        try:
            ctx = provider.collect(col)
            ctx.__enter__()
        except (KeyboardInterrupt, GeneratorExit, Exception):
            raise
        except BaseException as err:  # SystemExit from a plugin must not end the run
            _fail(col, name, err)
            ctx = None
        if ctx is None:
            yield
            return
        try:
            yield
        except BaseException as err:
            ctx.__exit__(type(err), err, err.__traceback__)
            raise
        try:
            with self._others_suspended(name):
                ctx.__exit__(None, None, None)
            col.flush()  # parameters the provider's collection still holds in pools
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:  # a broken provider must not stop training
            _fail(col, name, err)

    @contextlib.contextmanager
    def _others_suspended(self, name: str) -> Iterator[None]:
        providers = self.router.providers
        with contextlib.ExitStack() as stack:
            if providers[name].recomputes:
                for other, provider in providers.items():
                    if other != name and provider.observes_forward:
                        stack.enter_context(provider.suspended())
            yield

    def _lacking(self, stat: Statistic, indices: Iterable[int]) -> list[int]:
        row, params = self.results[stat.identity], self.router.params
        return [i for i in sorted(indices) if row[i] is None and params[i].grad is not None]

    def _fall_back(self) -> None:
        """Hand parameters a provider left empty to a provider that recomputes the pass."""
        router = self.router
        for name in router.order:
            provider = router.providers[name]
            if not provider.recomputes:
                continue
            targets: dict[Identity, frozenset[int]] = {}
            for stat in self.stats:
                kind = requested_kind(stat)
                if not provider.delivers(kind):
                    continue
                lacking = {
                    i
                    for other, table in self.served.items()
                    if other != name and stat.identity in table
                    for i in self._lacking(stat, table[stat.identity])
                    if provider.supports(router.slots[i], kind) is None
                }
                if lacking:
                    targets[stat.identity] = frozenset(lacking)
            if not targets:
                continue
            _tell_fell_back(provider, self._backed_up(name, targets))
            col = self.collection(targets, eager=False)
            try:
                with self._guarded(name, col):
                    pass
            except Exception:  # e.g. no info["inputs"]: keep the first provider's message
                continue
            filled = self._merge(col)
            reasons = sorted({m for c in self.collections.values() for m in c.missing.values()})
            self.collections[f"{name} (fallback)"] = col
            if filled and name not in router.warned:
                router.warned.add(name)
                names = [router.names[i] for i in sorted(filled)]
                warnings.warn(
                    f"cockpit: the providers routed to {name_list(names, len(router.params))} "
                    f"left some of their statistics empty ({' '.join(reasons) or 'no reason given'}); "
                    f"the '{name}' provider recomputed them, which costs another forward and "
                    "backward pass. Warned once; `cp.check(model)` shows the routes.",
                    CockpitWarning,
                    stacklevel=6,
                )

    def _backed_up(
        self, name: str, targets: Mapping[Identity, frozenset[int]]
    ) -> dict[StatisticProvider, frozenset[int]]:
        """For a fallback of provider ``name``: which provider left which parameters empty."""
        out: dict[StatisticProvider, set[int]] = {}
        for other, table in self.served.items():
            if other == name:
                continue
            for ident, indices in targets.items():
                common = indices & table.get(ident, frozenset())
                if common:
                    out.setdefault(self.router.providers[other], set()).update(common)
        return {p: frozenset(v) for p, v in out.items()}

    def _missing(self) -> dict[Identity, str]:
        """A message per statistic that some parameters (with a gradient) did not receive."""
        router, out = self.router, {}
        for stat in self.stats:
            ident = stat.identity
            lacking = self._lacking(stat, range(len(router.params)))
            if not lacking:
                continue
            parts = [c.missing[ident] for c in self.collections.values() if ident in c.missing]
            parts = list(dict.fromkeys(parts))
            orphans = [i for i in self.unrouted.get(ident, []) if i in lacking]
            if orphans:
                parts.append(router.unrouted_message(stat, orphans))
            if not parts:
                where = ", ".join(f"'{router.names[i]}'" for i in lacking)
                parts.append(f"No {stat.describe()} was computed for parameter(s) {where}.")
            elif router.model is None and not orphans:
                parts.append(f"Or: {MODEL_HINT}")
            out[ident] = " ".join(parts)
        return out


def _tell_fell_back(
    provider: StatisticProvider, others: Mapping[StatisticProvider, frozenset[int]]
) -> None:
    """``provider.fell_back(others)``; a provider that raises there only loses that notice."""
    try:
        provider.fell_back(others)
    except Exception as err:  # plugin code must not stop training
        warnings.warn(
            f"cockpit: statistics provider {provider.name!r} failed in fell_back: "
            f"{type(err).__name__}: {err}",
            CockpitWarning,
            stacklevel=2,
        )


def _fail(col: Collection, name: str, err: BaseException) -> None:
    """Every statistic of ``col`` is missing: its provider ``name`` raised ``err``."""
    message = f"provider '{name}' raised {type(err).__name__}: {err}; its statistics are missing."
    for stat in col.statistics:
        col.fail(stat, message)


def _compare(index: int, grad: Any, mean: Any) -> tuple[int, float, float] | None:
    """``(index, ratio, residual)`` with ``grad ~ ratio * mean`` by least squares."""
    if grad is None or mean is None:
        return None
    g = grad.detach().double().reshape(-1)
    m = mean.double().reshape(-1).to(g.device)
    mm, gg = float(m @ m), float(g @ g)
    if mm == 0.0 or gg == 0.0 or not (mm < float("inf") and gg < float("inf")):
        return None
    ratio = float(g @ m) / mm
    residual = float((g - ratio * m).norm()) / gg**0.5
    return index, ratio, residual
