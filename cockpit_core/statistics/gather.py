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
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cockpit_core.errors import CockpitWarning
from cockpit_core.requirements import Statistic
from cockpit_core.statistics.messages import MODEL_HINT, name_list
from cockpit_core.statistics.provider import Collection

if TYPE_CHECKING:
    from cockpit_core.statistics.router import StatisticsRouter

Identity = tuple[str, str]
Results = dict[Identity, list[Any]]


class StepCollection:
    """The statistics of one backward pass, from every provider that serves some of them."""

    def __init__(
        self,
        router: StatisticsRouter,
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
            samples=self.samples,
            loss_scale=self.loss_scale,
            requests=requests,
            owners=self.owners,
        )

    @contextlib.contextmanager
    def run(self, eager: bool) -> Iterator[tuple[Results, dict[Identity, str]]]:
        """Context around ``backward()``; yields ``(statistics, missing)`` (see ``collect``)."""
        router = self.router
        router.require_model(self.stats, self.unrouted)
        missing: dict[Identity, str] = {}
        names = [*self.served, *(n for n in self.requests if n not in self.served)]
        self.collections = {
            name: self.collection(self.served.get(name, {}), eager, self.requests.get(name, ()))
            for name in names
        }
        checking = self._check_target() if eager else None
        if checking is not None:
            self.collections[checking[0]].check_index = checking[1]
        with contextlib.ExitStack() as stack:
            # providers that recompute the pass run theirs last, with the others' hooks off
            for name in sorted(self.collections, key=lambda n: not router.providers[n].recomputes):
                stack.enter_context(self._guarded(name, self.collections[name]))
            yield self.results, missing
        for col in self.collections.values():
            self._merge(col)
        self._fall_back()
        missing.update(self._missing())
        if checking is not None:
            name, index = checking
            mean = self.collections[name].check_mean
            router.checked = _compare(index, router.params[index].grad, mean)

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

    def _check_target(self) -> tuple[str, int] | None:
        """``(provider, index)``: the smallest parameter a per-sample provider serves now."""
        router, best = self.router, None
        for stat in self.stats:
            if not stat.per_sample:
                continue
            for name, table in self.served.items():
                provider = router.providers[name]
                if not provider.per_sample or provider.recomputes:
                    continue
                for i in table.get(stat.identity, ()):
                    size = router.params[i].numel()
                    if best is None or size < best[0]:
                        best = (size, name, i)
        return None if best is None else (best[1], best[2])

    @contextlib.contextmanager
    def _guarded(self, name: str, col: Collection) -> Iterator[None]:
        """``provider.collect(col)``; a provider that raises after backward loses its statistics.

        Exceptions while it sets up (``MisuseError``, ``MissingInfoError``) reach the user;
        any other ``BaseException`` of the plugin (``SystemExit``), at setup or after
        ``backward``, costs only its statistics.
        """
        provider = self.router.providers[name]
        ctx: contextlib.AbstractContextManager | None = None
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

    def _lacking(self, stat: Statistic, indices) -> list[int]:
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
                if not provider.delivers(stat.kind):
                    continue
                lacking = {
                    i
                    for other, table in self.served.items()
                    if other != name and stat.identity in table
                    for i in self._lacking(stat, table[stat.identity])
                    if provider.supports(router.slots[i], stat.kind) is None
                }
                if lacking:
                    targets[stat.identity] = frozenset(lacking)
            if not targets:
                continue
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
