"""Checks of everything a plugin registers: :func:`check_plugin`.

Run them in your distribution's tests, after ``pip install -e .``::

    from cockpit_core.testing import check_plugin

    def test_everything_my_plugin_registers():
        check_plugin("my_plugin")  # the entry-point name in pyproject.toml

The plugin is loaded the way ``cockpit`` loads it (with every other installed plugin, so
name collisions show), and each thing it registers goes through the matching check of the
kit. All problems are collected and raised together as one :class:`ConformanceError`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit_core.config.quantities import resolve_quantities
from cockpit_core.errors import CockpitError
from cockpit_core.plugin.discovery import PluginInfo
from cockpit_core.plugin.registry import Registry
from cockpit_core.statistics.func import FuncProvider
from cockpit_core.testing.conformance import ConformanceError, check_quantity
from cockpit_core.testing.diagnosis_checks import check_diagnosis
from cockpit_core.testing.instrument_checks import check_instrument
from cockpit_core.testing.problems import tiny_mlp
from cockpit_core.testing.providers.kit import check_provider
from cockpit_core.testing.runner import run_cockpit


@dataclass
class PluginReport:
    """What :func:`check_plugin` checked.

    Attributes:
        name: The plugin's name (its entry-point name, or the module name).
        distribution: The distribution that declares it.
        version: Its version.
        checked: ``"<what> <name>"`` of every check that passed, in the order run, e.g.
            ``"quantity max_sample_grad_norm"``.
        not_checked: ``"<what> <name>: why"`` of what was registered but not checked
            (listed in ``skip``, or a statistic kind that is not per-sample).

    """

    name: str
    distribution: str
    version: str
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"plugin '{self.name}' ({self.distribution} {self.version}): all checks passed"]
        lines += [f"  ok   {item}" for item in self.checked]
        lines += [f"  skip {item}" for item in self.not_checked]
        return "\n".join(lines)


def check_plugin(
    plugin: str | object,
    *,
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
    skip: tuple[str, ...] = (),
) -> PluginReport:
    """Load a plugin and check everything it registers; raise every problem at once.

    The plugin is loaded with all installed plugins (:meth:`Registry.from_entry_points`, so
    also the local ones of ``COCKPIT_PLUGINS_DIR``). Then:

    * it must load: import, protocol version, hook names, every hook without an exception;
    * none of its names may collide with another plugin's;
    * each quantity passes :func:`check_quantity`, each instrument :func:`check_instrument`
      (drawn from a short run of the quantities it reads, found in the registry), each
      statistics provider :func:`check_provider`;
    * each preset resolves: its members are installed and their options valid;
    * each sink is built with its default options, receives every record of a short run
      (the plugin's own quantities, else none) and is closed, without an exception;
    * each per-sample statistic kind is computed by the ``func`` provider and compared with
      its ``from_per_sample`` on loop gradients (``check_provider(FuncProvider, kinds=[kind])``);
    * each diagnosis follows the protocol (:func:`~cockpit_core.diagnosis.check_diagnosis_class`),
      its options are described, validate with their defaults and reject unknown names,
      and ``check`` runs without raising on an empty window and on the window of a short
      run of the installed quantities it reads, returning JSON-compatible findings of its
      own name (:func:`check_diagnosis`).

    Args:
        plugin: The entry-point name (group ``cockpit``) or local plugin name, or a plugin
            object (a module with hook implementations), e.g. to check a plugin before it is
            installed.
        arguments: Keyword arguments for the check of the thing registered as a name:
            ``{"my_quantity": {"options": {"bins": 10}, "info_extra": {...}}}`` for
            :func:`check_quantity`, ``{"my_provider": {"problems": [...]}}`` for
            :func:`check_provider`, ``{"my_panel": {"options": {...}}}`` for
            :func:`check_instrument`, ``{"my_rule": {"options": {...}}}`` for
            :func:`check_diagnosis`, and a sink's factory options.
        skip: Names of registered things not to check (reported in ``not_checked``).

    Returns:
        What was checked, when everything passed.

    Raises:
        ConformanceError: The plugin cannot be found or loaded, or a list of every problem
            (``quantity 'x': ...``, ``sink 'y': ...``).

    """
    arguments = dict(arguments or {})
    registry, info = _load(plugin)
    report = PluginReport(info.name, info.distribution, info.version)
    problems = [f"name collision: {err}" for err in _conflicts(registry, info)]
    if info.name in registry.extension_errors:
        problems.append(registry.extension_errors[info.name])

    # ``check`` is called without arguments; ``...`` because mypy cannot infer a lambda whose
    # defaults bind the loop's values (``lambda cls=cls: ...``)
    def run(what: str, name: str, check: Callable[..., Any]) -> None:
        if name in skip:
            report.not_checked.append(f"{what} {name}: in skip")
            return
        try:
            check()
        except ConformanceError as err:
            problems.append(f"{what} '{name}': {err}")
        except Exception as err:  # a check must not stop the others
            problems.append(f"{what} '{name}': {type(err).__name__}: {err}")
        else:
            report.checked.append(f"{what} {name}")

    for name in info.quantities:
        cls = registry.quantities[name].cls
        run(
            "quantity",
            name,
            lambda cls=cls, name=name: check_quantity(cls, **arguments.get(name, {})),
        )
    for name in info.presets:
        run("preset", name, lambda name=name: _check_preset(registry, name))
    for name in info.instruments:
        if f"instrument:{name}" in registry.conflicts:
            continue  # reported as a collision; the registry holds the other plugin's
        inst = registry.instruments[name]
        run(
            "instrument",
            name,
            lambda inst=inst, name=name: check_instrument(
                inst, registry=registry, **arguments.get(name, {})
            ),
        )
    for name in info.providers:
        pcls = registry.providers[name].cls
        run(
            "provider",
            name,
            lambda pcls=pcls, name=name: check_provider(pcls, **arguments.get(name, {})),
        )
    for name in info.sinks:
        if f"sink:{name}" in registry.conflicts:
            continue
        entry = registry.sinks[name]
        run(
            "sink",
            name,
            lambda entry=entry: _check_sink(entry, arguments, info, registry),
        )
    for name in info.kinds:
        kind = registry.kinds[name]
        if not kind.per_sample:
            report.not_checked.append(
                f"statistic kind {name}: not per-sample (the check of a provider that "
                "computes it covers it)"
            )
            continue
        run("statistic kind", name, lambda kind=kind: _check_kind(kind))
    for name in info.diagnoses:
        if f"diagnosis:{name}" in registry.conflicts:
            continue
        dcls = registry.diagnoses[name].cls
        run(
            "diagnosis",
            name,
            lambda dcls=dcls, name=name: check_diagnosis(
                dcls, registry=registry, **arguments.get(name, {})
            ),
        )
    if problems:
        listing = "\n".join("  - " + problem.replace("\n", "\n    ") for problem in problems)
        raise ConformanceError(
            f"plugin '{info.name}' ({info.distribution} {info.version}) has "
            f"{len(problems)} problem{'s' if len(problems) > 1 else ''}:\n{listing}"
        )
    return report


def _load(plugin: str | object) -> tuple[Registry, PluginInfo]:
    """A registry of every installed plugin, and the info of ``plugin`` in it."""
    registry = Registry.from_entry_points()
    if isinstance(plugin, str):
        infos = [p for p in registry.plugins if p.name == plugin]
        if not infos:
            names = ", ".join(sorted(p.name for p in registry.plugins)) or "none"
            raise ConformanceError(
                f"no cockpit plugin is named '{plugin}' (installed: {names}). Install the "
                "distribution that declares it (`pip install -e .` in its folder); its "
                "pyproject.toml declares it under [project.entry-points.cockpit]."
            )
        info = infos[0]
    elif registry.plugin_manager.is_registered(plugin):
        name = registry.plugin_manager.get_name(plugin)
        info = next(p for p in registry.plugins if p.name == name)
    else:
        name = getattr(plugin, "__name__", None) or type(plugin).__name__
        info = registry.add_plugin(plugin, name=name)
    if not info.ok:
        raise ConformanceError(
            f"plugin '{info.name}' ({info.distribution} {info.version}) failed to load: "
            f"{info.error}"
        )
    return registry, info


def _conflicts(registry: Registry, info: PluginInfo) -> list[str]:
    """The registry's name collisions that involve ``info``'s distribution."""
    return [str(err) for err in registry.conflicts.values() if f"'{info.distribution}'" in str(err)]


def _check_preset(registry: Registry, name: str) -> None:
    try:
        resolve_quantities(name, registry)
    except CockpitError as err:
        raise ConformanceError(f"does not resolve: {err}") from err


class _RecordingSink:
    """Passes records to a sink and remembers what it raised (Cockpit would drop it)."""

    def __init__(self, sink: Callable[[dict[str, Any]], None]):
        self.sink = sink
        self.records = 0
        self.error: BaseException | None = None
        self.where = ""

    def __call__(self, record: dict[str, Any]) -> None:
        self.records += 1
        try:
            self.sink(record)
        except Exception as err:
            if self.error is None:
                self.error, self.where = err, f"a '{record.get('kind')}' record"
            raise

    def close(self) -> None:
        close = getattr(self.sink, "close", None)
        if callable(close):
            try:
                close()
            except Exception as err:
                if self.error is None:
                    self.error, self.where = err, "close()"
                raise


def _check_sink(
    entry: Any,
    arguments: Mapping[str, Mapping[str, Any]],
    info: PluginInfo,
    registry: Registry,
) -> None:
    """Build the sink and feed it the records of a run of the plugin's quantities (if any)."""
    options = dict(arguments.get(entry.name, {}))
    quantities = [registry.quantities[q].cls for q in info.quantities]
    info_extra: dict[str, Any] = {}
    for q in info.quantities:
        info_extra.update(arguments.get(q, {}).get("info_extra") or {})
    with _in_temporary_folder():  # sinks may write files relative to the working directory
        try:
            sink = entry.make(options)
        except Exception as err:
            raise ConformanceError(
                f"building it with options {options} failed: {type(err).__name__}: {err}; "
                "give every option a default, or pass check_plugin(arguments={name: {...}})"
            ) from err
        if not callable(sink):
            raise ConformanceError(f"its factory returned {sink!r}, which is not callable.")
        recorder = _RecordingSink(sink)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Cockpit warns when it drops a raising sink
            result = run_cockpit(
                tiny_mlp(),
                quantities,
                steps=3,
                sinks=[recorder],
                info_extra=info_extra,
            )
            result.cockpit.log(2, train_loss=1.0)
            result.cockpit.close()
    if recorder.error is not None:
        raise ConformanceError(
            f"raised {type(recorder.error).__name__}: {recorder.error} on {recorder.where} of "
            "a run (a sink receives header, values, error, skipped, metrics and "
            "quantity_added records, and must ignore kinds it does not know)."
        ) from recorder.error
    if not recorder.records:
        raise ConformanceError("received no record of a run.")


def _check_kind(kind: Any) -> None:
    check_provider(FuncProvider, kinds=[kind], problems=[tiny_mlp()])


@contextlib.contextmanager
def _in_temporary_folder() -> Iterator[Path]:
    previous = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="cockpit-check-plugin-") as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(previous)
