"""Every hook a cockpit plugin can implement, with its version history.

A plugin is a module (or object) named by an entry point in the group ``cockpit``::

    [project.entry-points.cockpit]
    my_plugin = "my_package.plugin"

Its hook implementations are functions decorated with :data:`hookimpl` whose names match
the specs below. Each hook receives a ``register`` callback; the core validates what is
registered and reports name collisions, naming both distributions. The callbacks are typed
by the protocols :class:`RegisterQuantity`, :class:`RegisterPreset`,
:class:`RegisterInstrument`, :class:`RegisterSink`, :class:`RegisterStatisticProvider`,
:class:`RegisterStatisticKind`, :class:`RegisterDiagnosis`, :class:`RegisterRenderer` and
:class:`RegisterCommand`, so a type checker verifies a plugin's calls::

    @hookimpl
    def register_quantities(register: RegisterQuantity) -> None:
        register(MyQuantity)

Plugin modules outside any distribution load from the folders of ``COCKPIT_PLUGINS_DIR``
(see :mod:`cockpit_core.plugin.discovery`).

A plugin module may set ``COCKPIT_PROTOCOL_VERSION = <int>``; if it differs from
:data:`PROTOCOL_VERSION` the plugin is skipped and reported by ``cockpit plugins``.

Compatibility rule: hooks evolve only by adding arguments (pluggy passes an
implementation only the arguments it names), never by removing or changing them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:  # only for annotations: importing them here would be an import cycle
    from pydantic import BaseModel

    from cockpit_core.diagnosis import Diagnosis
    from cockpit_core.instrument import Instrument
    from cockpit_core.quantity import Quantity
    from cockpit_core.statistics.kinds import StatisticKind
    from cockpit_core.statistics.provider import StatisticProvider

PROJECT_NAME = "cockpit"
"""pluggy project name, also the entry-point group plugins register under."""

PROTOCOL_VERSION = 1
"""Version of the plugin protocol (this module plus the quantity protocol)."""

LIVE_PLOT_SINK = "live_plot"
"""The sink ``Cockpit(live_plot=PATH, live_every=N)`` builds, with options ``path`` and
``every``: a picture of the dashboard refreshed while training runs. A plugin that draws
dashboards registers it (cockpit-dashboard does)."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -- the register callbacks ------------------------------------------------------------------


class RegisterQuantity(Protocol):
    """``register`` of :func:`register_quantities`: ``register(QuantityClass)``."""

    def __call__(self, quantity: type[Quantity], /) -> None:
        """Register one :class:`~cockpit_core.Quantity` subclass."""


class RegisterPreset(Protocol):
    """``register`` of :func:`register_presets`: ``register(name, quantities, description="")``."""

    def __call__(
        self, name: str, quantities: Iterable[str | Mapping[str, Any]], description: str = ""
    ) -> None:
        """Register a preset: quantity names or config dicts (``{"name": ..., **options}``)."""


class RegisterInstrument(Protocol):
    """``register`` of :func:`register_instruments`: ``register(Instrument(...))``."""

    def __call__(self, instrument: Instrument, /) -> None:
        """Register one :class:`~cockpit_core.instrument.Instrument` (a dashboard panel)."""


class RegisterSink(Protocol):
    """``register`` of :func:`register_sinks`: ``register(name, factory, config=None, description="")``."""

    def __call__(
        self,
        name: str,
        factory: Callable[..., Callable[[dict[str, Any]], None]],
        config: type[BaseModel] | None = None,
        description: str = "",
    ) -> None:
        """Register a sink factory; ``factory(**options)`` returns ``sink(record)``."""


class RegisterStatisticProvider(Protocol):
    """``register`` of :func:`register_statistic_providers`: ``register(ProviderClass)``."""

    def __call__(self, provider: type[StatisticProvider], /) -> None:
        """Register one :class:`~cockpit_core.StatisticProvider` subclass."""


class RegisterStatisticKind(Protocol):
    """``register`` of :func:`register_statistic_kinds`: ``register(StatisticKind(...))``."""

    def __call__(self, kind: StatisticKind, /) -> None:
        """Register one :class:`~cockpit_core.StatisticKind`."""


class RegisterDiagnosis(Protocol):
    """``register`` of :func:`register_diagnoses`: ``register(DiagnosisClass)``."""

    def __call__(self, diagnosis: type[Diagnosis], /) -> None:
        """Register one :class:`~cockpit_core.diagnosis.Diagnosis` subclass."""


class RegisterRenderer(Protocol):
    """``register`` of :func:`register_renderers`: ``register(suffix, render, description="")``."""

    def __call__(self, suffix: str, render: Callable[..., Any], description: str = "") -> None:
        """Register ``render(source, path, **options)`` for files ending in ``suffix``."""


class RegisterCommand(Protocol):
    """``register`` of :func:`register_commands`: ``register(name, configure, run, help="")``."""

    def __call__(
        self,
        name: str,
        configure: Callable[[argparse.ArgumentParser], None],
        run: Callable[[argparse.Namespace], int | None],
        help: str = "",
    ) -> None:
        """Register the sub-command ``cockpit NAME``."""


REGISTER_PROTOCOLS: dict[str, type] = {
    "register_quantities": RegisterQuantity,
    "register_presets": RegisterPreset,
    "register_instruments": RegisterInstrument,
    "register_sinks": RegisterSink,
    "register_statistic_providers": RegisterStatisticProvider,
    "register_statistic_kinds": RegisterStatisticKind,
    "register_diagnoses": RegisterDiagnosis,
    "register_renderers": RegisterRenderer,
    "register_commands": RegisterCommand,
}
"""The type of each hook's ``register`` argument, by hook name."""


# -- what is tracked ------------------------------------------------------------------------


@hookspec
def register_quantities(register: RegisterQuantity) -> None:
    """Register the quantity classes this plugin provides.

    Call ``register(QuantityClass)`` once per class. The class must subclass
    :class:`cockpit_core.Quantity` with a unique snake_case ``name``; its class name is
    accepted as an alias in configs.

    Added in protocol version 1.
    """


@hookspec
def register_presets(register: RegisterPreset) -> None:
    """Register named presets: lists of quantities usable as ``quantities="economy"``.

    Call ``register(name, quantities, description="")`` where ``quantities`` is a list of
    quantity names or config dicts (``{"name": "hess_max_ev", "every": 10}``). Members
    may come from other plugins; a preset whose members are not installed gives a clear
    error only when it is used.

    Added in protocol version 1.
    """


# -- where values go ------------------------------------------------------------------------


@hookspec
def register_instruments(register: RegisterInstrument) -> None:
    """Register dashboard instruments (panels) for this plugin's quantities.

    Call ``register(Instrument(...))`` once per panel, with a
    :class:`cockpit_core.instrument.Instrument`: a unique ``name``, a ``title``, a ``topic``
    (``"step size"``, ``"gradient"``, ``"curvature"``, ``"performance"`` or a topic of the
    plugin's own, which gets its own column), the quantity names it needs and a function
    ``draw(ax, output, header)``. The dashboard draws a panel only when its quantities were
    tracked and lists the panels it skipped. Importing matplotlib at module level is
    discouraged (discovery must stay fast): ``draw`` receives a ready matplotlib ``Axes``.

    Added in protocol version 1.
    """


@hookspec
def register_sinks(register: RegisterSink) -> None:
    """Register sinks: named destinations that receive every record of a run.

    Call ``register(name, factory, config=None, description="")``. ``factory(**options)``
    returns a callable ``sink(record)`` (optionally with a ``close()`` method) that gets the
    header, values, error, skipped, metrics, quantity_added, quantity_removed and resumed
    records, among others (the layout of ``docs/log_format.md``; it should ignore kinds it
    does not know). ``config`` is
    an optional pydantic model (``extra="forbid"``) that validates the options. Users enable
    a sink by name: ``Cockpit(..., sinks=["tensorboard", {"name": "tensorboard",
    "log_dir": "runs/tb"}])``. A sink that raises is removed and training goes on.

    Added in protocol version 1.
    """


# -- where statistics come from -------------------------------------------------------------


@hookspec
def register_statistic_providers(register: RegisterStatisticProvider) -> None:
    """Register statistics providers: sources of per-parameter statistics.

    Call ``register(ProviderClass)`` once per class. The class must subclass
    :class:`cockpit_core.StatisticProvider` with a unique snake_case ``name``; users select it
    with ``backend="<name>"`` (or a list of names in order of preference), and with
    ``backend="auto"`` the router prefers providers of lower ``cost``. A provider may also
    serve the user's own *requests*, objects passed as ``cp(step, *requests)`` (e.g. BackPACK
    extensions): it says which with ``StatisticProvider.accepts(request)`` and finds them in
    ``Collection.requests``. See ``docs/providers.md``.

    Added in cockpit-core 0.2 (protocol version 1). Requests are an optional addition within
    protocol version 1: ``accepts`` defaults to accepting nothing.
    """


@hookspec
def register_statistic_kinds(register: RegisterStatisticKind) -> None:
    """Register new kinds of statistics that quantities can request.

    Call ``register(StatisticKind(name, per_sample=..., combine=..., ...))`` once per kind.
    A per-sample kind declares ``from_per_sample(grads, statistic, param)``; every provider
    that delivers per-sample gradients then computes it. The name must not collide with a
    built-in kind or another plugin's.

    Added in cockpit-core 0.2 (protocol version 1).
    """


# -- what the values mean -------------------------------------------------------------------


@hookspec
def register_diagnoses(register: RegisterDiagnosis) -> None:
    """Register diagnoses: rules that read logged values and report findings with evidence.

    Call ``register(DiagnosisClass)`` once per class. The class must subclass
    :class:`cockpit_core.diagnosis.Diagnosis` with a unique snake_case ``name``, the quantity
    names it ``reads``, its thresholds as a ``Config`` (a
    :class:`~cockpit_core.diagnosis.DiagnosisConfig`) and a ``check(window)`` method that
    returns :class:`~cockpit_core.diagnosis.Finding` objects. ``cockpit diagnose LOG`` runs
    every installed diagnosis on a log; ``Cockpit(..., diagnoses=[...])`` runs the named
    ones while training. See ``docs/diagnoses.md``.

    Added in cockpit-core 0.2 (protocol version 1).
    """


# -- how runs are shown -----------------------------------------------------------------------


@hookspec
def register_renderers(register: RegisterRenderer) -> None:
    """Register renderers: what draws the runs' values into a file of one type.

    Call ``register(suffix, render, description="")`` once per file type (``".png"``,
    ``".html"``). ``render(source, path, **options)`` draws ``source`` (a
    :class:`~cockpit_core.Cockpit`, a log path, or a list of them to compare, a colour per
    run) into ``path`` and returns it; with ``path=None`` it returns what it drew (e.g. a
    matplotlib figure). ``Cockpit.plot(path)`` and ``cockpit plot LOG -o PATH`` pick the
    renderer by the suffix of ``path``. Import the drawing library inside ``render``, not at
    module level: discovery must stay fast.

    Added in cockpit-core 0.3 (protocol version 1).
    """


@hookspec
def register_commands(register: RegisterCommand) -> None:
    """Register sub-commands of the ``cockpit`` command line.

    Call ``register(name, configure, run, help="")`` once per command. ``configure(parser)``
    adds the command's arguments to its :class:`argparse.ArgumentParser` (and may set its
    ``description``, shown by ``--help`` instead of ``help``); ``run(args)`` runs
    it with the parsed arguments and returns the exit code (``None`` counts as 0). A
    :class:`~cockpit_core.errors.CockpitError` it raises is printed as a message with exit
    code 1, as for the core's own commands. A name of :data:`cockpit_core.cli.CORE_COMMANDS` cannot be taken.
    Import heavy modules inside ``run``: plugins are loaded when the command line names a
    command that is not the core's.

    Added in cockpit-core 0.3 (protocol version 1).
    """


HOOK_NAMES: tuple[str, ...] = (
    "register_quantities",
    "register_presets",
    "register_instruments",
    "register_sinks",
    "register_statistic_providers",
    "register_statistic_kinds",
    "register_diagnoses",
    "register_renderers",
    "register_commands",
)
"""All hook names, in documentation order (meta-tests check docs and tests cover each)."""


def hook_signatures() -> dict[str, Any]:
    """Map each hook name to its spec function (for docs and meta-tests)."""
    return {name: globals()[name] for name in HOOK_NAMES}
