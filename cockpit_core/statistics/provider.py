"""The statistics-provider protocol: where per-parameter statistics come from.

A *provider* computes statistics of some kinds for some parameters during a tracked step:
BackPACK's extensions (``cockpit-backpack``), module hooks (``cockpit-hooks``),
``torch.func`` (built in), or a third party's. Providers come in through the
``register_statistic_providers`` hook; for each parameter and requested kind the router
(:mod:`cockpit_core.statistics.router`) picks the cheapest provider whose
:meth:`StatisticProvider.supports` accepts it, and hands every provider what it serves
in one :class:`Collection` per step. ``docs/providers.md`` walks through writing one.

Life of a provider inside a Cockpit:

1. ``__init__(params, names, options)``: once, with the tracked parameters;
2. :meth:`~StatisticProvider.attach` when the model becomes known (``cp.attach`` or
   ``Cockpit(model, ...)``); routing asks :meth:`~StatisticProvider.supports` per
   ``(parameter, kind)`` and caches the answer;
3. providers that must see the forward pass (``observes_forward = True``) are
   :meth:`~StatisticProvider.arm`-ed before the forward pass of a step that needs them
   (the Cockpit predicts the next tracked step) and disarmed otherwise;
4. :meth:`~StatisticProvider.collect` is a context manager around the user's
   ``backward()``: the provider fills the collection during ``backward`` or on exit;
5. :meth:`~StatisticProvider.close` when the Cockpit closes.

*Requests* are objects the user passes to the step, ``cp(step, *requests, info=...)``
(e.g. BackPACK extensions whose results the user reads after the step): each goes to the
first installed provider whose :meth:`~StatisticProvider.accepts` returns ``True``, and
reaches it in :attr:`Collection.requests`. A provider that observes the forward pass stays
armed for every parameter once it received requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel

from cockpit_core.statistics import pool
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.per_sample import PerSampleGrads
from cockpit_core.statistics.reduce import reduce_per_sample
from cockpit_core.statistics.statistic import Statistic

Identity = tuple[str, str]


@dataclass(frozen=True)
class ParamSlot:
    """One tracked parameter, as routing and providers see it.

    Attributes:
        index: Position among the tracked parameters.
        name: Its name (``model.named_parameters()`` or as given to the Cockpit).
        param: The parameter.
        module: The module that registers it, ``None`` while the model is unknown.
        module_name: That module's qualified name (``""`` for the root).
        attribute: The parameter's attribute name in ``module`` (e.g. ``"weight"``).
        shared: Whether more than one module registers it (tied weights).

    """

    index: int
    name: str
    param: torch.nn.Parameter
    module: torch.nn.Module | None = None
    module_name: str = ""
    attribute: str = ""
    shared: bool = False

    @property
    def label(self) -> str:
        """``'encoder.norm1' (LayerNorm)``, or the parameter's name (``'pos' (GPT)``).

        The parameter's name stands for a module without a model, and for parameters the
        model owns itself.
        """
        if self.module is None:
            return f"'{self.name}'"
        return f"'{self.module_name or self.name}' ({type(self.module).__name__})"


@dataclass
class Collection:
    """What one provider computes at one step, and where it puts the results.

    Attributes:
        statistics: The statistics this provider serves at this step.
        targets: For each statistic identity, the parameter indices it serves.
        slots: Every tracked parameter (indexed like ``targets``).
        batch_size: The number of samples ``B`` whose mean loss the step's gradient is of:
            ``B * dL/d(output_n)`` is sample ``n``'s own gradient (``info["batch_size"]``).
        samples: Samples in this backward pass, when fewer than ``batch_size`` (a
            micro-batch of gradient accumulation); ``None``: ``batch_size``.
        loss_scale: The factor the backpropagated loss was multiplied by (a
            ``torch.amp.GradScaler``'s scale; 1 without one). Providers divide what they
            read from the backward pass by it: :attr:`per_sample_scale`.
        check_index: A parameter whose per-sample gradients' mean the core compares with
            its ``p.grad`` after ``backward`` (:attr:`check_mean`), to detect a loss that is
            not the mean over ``batch_size`` samples, or gradients scaled unannounced.
        check_mean: Set by :meth:`deliver` for ``check_index`` (a provider that recomputes
            the pass sets it itself when it does not deliver through :meth:`deliver`).
        grad_of_batch: Whether ``p.grad`` after ``backward`` is the gradient of exactly this
            collection's samples (one process, no gradient accumulation), also when the
            collection is entered after ``backward`` (a fallback). A provider that
            recomputes the pass compares the mean of its per-sample gradients with it
            (:mod:`cockpit_core.statistics.mean_check`).
        info: The step's ``info`` dict (``inputs`` and ``targets`` for providers that
            recompute the forward pass).
        eager: Whether the final gradient of a parameter equals the mean of its
            per-sample gradients as soon as they are complete (one process, no gradient
            accumulation): projections can then be formed during ``backward``.
        results: ``results[identity][index]``, filled by the provider.
        missing: A message per statistic that some served parameters did not receive.
        requests: The objects passed to ``cp(step, *requests)`` that this provider
            :meth:`~StatisticProvider.accepts`, in the user's order (a provider with
            requests but no statistics at a step still gets a collection).
        owners: For each statistic identity, the quantities that need it (for messages).
        pooling: Whether :meth:`deliver` may hold small parameters' per-sample gradients
            and reduce them together (:mod:`cockpit_core.statistics.pool`); their values are
            recorded by :meth:`flush` (set by the core for a step's collections).

    """

    statistics: tuple[Statistic, ...]
    targets: dict[Identity, frozenset[int]]
    slots: Sequence[ParamSlot]
    batch_size: int
    info: Mapping[str, Any] = field(default_factory=dict)
    samples: int | None = None
    loss_scale: float = 1.0
    check_index: int | None = None
    check_mean: Any = None
    grad_of_batch: bool = False
    eager: bool = False
    results: dict[Identity, list[Any]] = field(default_factory=dict)
    missing: dict[Identity, str] = field(default_factory=dict)
    requests: tuple[Any, ...] = ()
    owners: Mapping[Identity, tuple[str, ...]] = field(default_factory=dict)
    pooling: bool = False
    _pools: dict[tuple[Any, ...], pool.Pool] = field(default_factory=dict, repr=False)
    _pooled_bytes: int = field(default=0, repr=False)

    @property
    def per_sample_scale(self) -> float:
        """``batch_size / loss_scale``: from output gradients to per-sample ones.

        It turns ``dL/d(output_n)`` of the backpropagated loss into sample ``n``'s own
        output gradient.
        """
        return self.batch_size / self.loss_scale

    def wanted(self, index: int) -> list[Statistic]:
        """The statistics requested of parameter ``index`` from this provider."""
        return [s for s in self.statistics if index in self.targets[s.identity]]

    @property
    def indices(self) -> frozenset[int]:
        """Every parameter index this provider serves at this step."""
        return frozenset().union(*self.targets.values()) if self.targets else frozenset()

    def store(self, stat: Statistic, index: int, value: Any) -> None:
        """Record the value of ``stat`` for parameter ``index``."""
        self.results.setdefault(stat.identity, [None] * len(self.slots))[index] = value

    def fail(self, stat: Statistic, message: str) -> None:
        """Record why ``stat`` could not be computed (the first message is kept)."""
        self.missing.setdefault(stat.identity, message)

    def deliver(self, index: int, grads: PerSampleGrads, defer: bool = False) -> None:
        """Compute every per-sample statistic wanted of parameter ``index`` from ``grads``.

        The usual way for a per-sample provider to hand back its work: call it as soon
        as a parameter's per-sample gradients are complete, then drop them. Projections
        are formed now when :attr:`eager` (unless ``defer``), else after ``backward`` by
        the core, on the final gradient. A statistic that raises is reported missing
        with its error; nothing propagates.

        With :attr:`pooling`, a small parameter's per-sample gradients may be held and
        reduced later together with others (:meth:`flush`).
        """
        if index == self.check_index:
            self.check_mean = grads.mean().detach()
        stats = [s for s in self.wanted(index) if s.per_sample]
        if not stats:
            return
        final = grads.mean if self.eager and not defer else None
        if self.pooling and self._pool(index, grads, stats, final):
            return
        values, failures = reduce_per_sample(stats, grads, self.slots[index].param, final)
        self._record(stats, index, values, failures)

    def _record(
        self,
        stats: Sequence[Statistic],
        index: int,
        values: Mapping[Identity, Any],
        failures: Mapping[Identity, str],
    ) -> None:
        for stat in stats:
            if stat.identity in failures:
                self.fail(stat, f"Computing {stat.describe()} raised {failures[stat.identity]}")
            elif stat.identity in values:
                self.store(stat, index, values[stat.identity])

    def _pool(self, index: int, grads: PerSampleGrads, stats: list[Statistic], final: Any) -> bool:
        """Hold parameter ``index``'s per-sample gradients in a pool; ``False``: reduce it now.

        Projections formed after ``backward`` (no ``final`` gradient yet) keep the compact
        form, as :func:`reduce_per_sample` does; the other statistics are pooled.
        """
        deferred = [s for s in stats if s.combine == "project" and final is None]
        stats = [s for s in stats if s not in deferred]
        if not stats or not all(pool.poolable(s, final is not None) for s in stats):
            return False
        param = self.slots[index].param
        try:
            dense = pool.member_grads(grads, param, kept=bool(deferred))
        except Exception:  # a form that cannot materialize: its own rules report why
            return False
        if dense is None:
            return False
        key = (tuple(dense.shape), dense.dtype, dense.device, tuple(s.identity for s in stats))
        held = self._pools.setdefault(key, pool.Pool(tuple(stats)))
        held.indices.append(index)
        held.grads.append(dense)
        held.params.append(param)
        if final is not None:
            held.finals.append(final)
        for stat in deferred:
            self.store(stat, index, grads)  # projected by the core after backward
        self._pooled_bytes += dense.numel() * dense.element_size()
        if self._pooled_bytes > pool.POOL_BYTES:
            self.flush()
        return True

    def flush(self) -> None:
        """Reduce the parameters held in pools and record their values (see :attr:`pooling`).

        Called by the core after the provider's :meth:`StatisticProvider.collect` ended; a
        provider that reads :attr:`results` before (e.g. to report what is missing) calls
        :meth:`received`, which flushes first.
        """
        pools, self._pools, self._pooled_bytes = self._pools, {}, 0
        for held in pools.values():
            with torch.no_grad():  # after backward, statistics must not record a graph
                values, failures = pool.reduce_pool(held)
            for k, index in enumerate(held.indices):
                row = {identity: v[k] for identity, v in values.items()}
                self._record(held.stats, index, row, failures)

    def received(self, stat: Statistic, index: int) -> bool:
        """Whether a value of ``stat`` for parameter ``index`` was recorded."""
        if self._pools:
            self.flush()
        row = self.results.get(stat.identity)
        return row is not None and row[index] is not None


class StatisticProvider:
    """Base class of statistics providers (subclass it, override what applies).

    Class attributes:
        name: snake_case name, used by ``backend=`` and shown by ``cp.check``.
        cost: Preference of the router: among providers that support a parameter and a
            kind, the one with the lowest cost serves it (``backend="auto"``).
        description: One line for ``cockpit plugins`` and ``cp.check``.
        per_sample: Whether it delivers per-sample gradients, and so every per-sample
            kind (through :meth:`Collection.deliver`).
        kinds: Names of the other kinds it delivers (e.g. curvature diagonals).
        observes_forward: Whether the provider must see the forward pass of a tracked
            step (then :meth:`arm` is called before it).
        recomputes: Whether it runs its own forward/backward pass after the user's
            ``backward`` (it may then serve parameters another provider failed on).
        options_model: A pydantic model of the provider's own options, which users set
            with ``Cockpit(..., provider_options={name: {...}})`` (or the config file's
            ``provider_options`` table); they are validated against it (unknown keys are
            refused) and merged into ``options``. ``None``: it takes none.

    Args:
        params: The tracked parameters.
        names: Their names.
        options: Cockpit options meant for providers (e.g. ``chunk_size``), and this
            provider's own ``provider_options``.

    """

    name: ClassVar[str] = ""
    cost: ClassVar[float] = 1.0
    description: ClassVar[str] = ""
    per_sample: ClassVar[bool] = False
    kinds: ClassVar[frozenset[str]] = frozenset()
    observes_forward: ClassVar[bool] = False
    recomputes: ClassVar[bool] = False
    options_model: ClassVar[type[BaseModel] | None] = None

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        options: Mapping[str, Any] | None = None,
    ):
        self.params = list(params)
        self.names = list(names)
        self.options = dict(options or {})
        self.model: torch.nn.Module | None = None
        self.loss_fn: Any = None

    def attach(self, model: torch.nn.Module, loss_fn: Any = None) -> None:
        """The model (and, if given, a per-sample loss ``loss_fn(outputs, targets)``)."""
        self.model, self.loss_fn = model, loss_fn

    @classmethod
    def prepare(cls, module: torch.nn.Module) -> torch.nn.Module:
        """Make ``module`` observable by this provider before it is first run (default: as is).

        Called on every installed provider (:meth:`Registry.prepare_module
        <cockpit_core.plugin.registry.Registry.prepare_module>`) where cockpit builds modules for a
        run itself: the loss module of ``cockpit check``'s sample batch and the tiny
        problems of the plugin authors' kit (:mod:`cockpit_core.testing.problems`).
        BackPACK's provider extends the module there. Return a module computing the same
        function (usually ``module`` itself); raise nothing for modules it does not know.
        """
        return module

    def delivers(self, kind: StatisticKind) -> bool:
        """Whether the provider computes ``kind`` at all (for some parameter of some model)."""
        return (kind.per_sample and self.per_sample) or kind in self.kinds

    def supports(self, slot: ParamSlot, kind: StatisticKind) -> str | None:
        """``None`` if the provider can deliver ``kind`` for ``slot``, else why it cannot.

        Only asked for kinds it :meth:`delivers`. The reason is shown by ``cp.check`` and
        in errors, e.g. ``"no rule for module GELU"``. Called once per ``(parameter,
        kind)`` after the model changed; answer from the module and its configuration (no
        forward pass has run yet).
        """
        return None

    def describe(self, slot: ParamSlot) -> str:
        """One line on how the provider serves ``slot`` (e.g. the rule of its module); "" if nothing to add."""
        return ""

    def accepts(self, request: Any) -> bool:
        """Whether the provider serves ``request``, an object passed to ``cp(step, *requests)``.

        Requests are the user's own asks beyond the quantities' statistics (e.g. BackPACK
        extensions, whose results stay on the parameters after the step). The router hands
        each request to the first installed provider that accepts it, in
        :attr:`Collection.requests`; an object no provider accepts is a ``MisuseError``.
        Answer from the object alone, never raise. Default: no request is accepted.
        """
        return False

    def arm(self, indices: frozenset[int]) -> None:
        """Prepare to observe the next forward pass for the parameters ``indices``.

        ``arm(frozenset())`` disarms (remove hooks: untracked steps then cost nothing).
        Only called when ``observes_forward``.
        """

    def armed(self, indices: frozenset[int]) -> bool:
        """Whether the last forward pass was observed for ``indices`` (see :meth:`arm`)."""
        return True

    def suspended(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the provider ignores forward and backward passes.

        Entered while a provider that ``recomputes`` runs its own pass on the model
        (hooks must neither record it nor break ``torch.func`` transforms).
        """
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Context around the user's ``backward()``; fill ``collection`` during or after it.

        Must never raise because a statistic failed: record it with
        :meth:`Collection.fail` and let training go on.
        """
        yield

    def fell_back(self, others: Mapping[StatisticProvider, frozenset[int]]) -> None:
        """It was asked to compute statistics of parameters other providers left empty.

        Called on a provider that ``recomputes`` after such a fallback at a step:
        ``others[p]`` are the parameters provider ``p`` left empty. A provider that must
        observe the forward pass can then also observe the forward passes those providers
        are :meth:`armed` for (it is not armed for parameters it does not serve). Default:
        nothing.
        """

    def close(self) -> None:
        """Release hooks and buffers (the Cockpit was closed)."""
