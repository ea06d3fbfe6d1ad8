"""Diagnosis objects from the entries that name them, options included.

:func:`build_diagnoses` builds the diagnoses of ``Cockpit(diagnoses=...)``, of a config
file's ``diagnoses`` (:mod:`cockpit_core.config.validation` checks them with it) and of
``cockpit diagnose`` (:mod:`cockpit_core.diagnosing.run`): names or ``{"name": ..., **options}``
entries, each diagnosis validating its options with its pydantic ``Config``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from cockpit_core.diagnosis import Diagnosis, UnknownDiagnosisError
from cockpit_core.errors import ConfigError
from cockpit_core.plugin import registry as plugin_registry
from cockpit_core.plugin.entries import DiagnosisEntry
from cockpit_core.plugin.name_table import NameTable
from cockpit_core.plugin.registry import Registry


def build_diagnoses(
    specs: Iterable[str | Mapping[str, Any]] | None = None,
    registry: Registry | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Diagnosis]:
    """Diagnosis objects from names or ``{"name": ..., **options}`` dicts (``None``: all).

    Args:
        specs: Names or ``{"name": ..., **options}`` of the diagnoses (``None``: every
            installed diagnosis, with default options).
        registry: Where the diagnoses come from (default: the installed plugins).
        options: ``{name: {option: value}}`` set on top of ``specs``, on every entry of that
            name (``cockpit diagnose --set NAME.OPTION=VALUE``).

    Raises:
        UnknownDiagnosisError: A name no installed plugin registers (with the closest one).
        ConfigError: Invalid options of a diagnosis (``diagnoses.<name>.<option>: ...``), an
            entry without a name, or ``options`` of a diagnosis that is not in ``specs``.

    """
    if registry is None:  # looked up when called, so that it can be replaced
        registry = plugin_registry.default_registry()
    table = registry.diagnoses
    chosen: list[tuple[str, DiagnosisEntry, dict[str, Any]]] = []
    if specs is None:
        chosen = [(name, entry, {}) for name, entry in sorted(table.items())]
    else:
        for i, spec in enumerate(specs):
            if isinstance(spec, Mapping):
                name, opts = spec.get("name"), {k: v for k, v in spec.items() if k != "name"}
            else:
                name, opts = spec, {}
            if not isinstance(name, str):
                raise ConfigError([(f"diagnoses.{i}.name", "a diagnosis needs a name")])
            chosen.append((name, _entry(table, name), opts))
    extra = dict(options or {})
    _check_options(extra, {name for name, _, _ in chosen}, table)
    return [_build(name, entry, {**opts, **extra.get(name, {})}) for name, entry, opts in chosen]


def _entry(table: NameTable[DiagnosisEntry], name: str) -> DiagnosisEntry:
    """The registry entry of the diagnosis ``name``; unknown: the closest name in the error."""
    entry = table.lookup(name)
    if entry is None:
        raise UnknownDiagnosisError(name, [n for n, _ in table.items()])
    return entry


def _check_options(
    options: Mapping[str, Mapping[str, Any]], chosen: set[str], table: NameTable[DiagnosisEntry]
) -> None:
    """Raise if ``options`` name an unknown diagnosis, one not ``chosen``, or set ``name``."""
    errors = []
    for name, opts in options.items():
        _entry(table, name)
        if name not in chosen:
            errors.append(
                (
                    f"diagnoses.{name}",
                    "options of a diagnosis that does not run: select it too (those that "
                    f"run: {', '.join(sorted(chosen)) or 'none'})",
                )
            )
        if "name" in opts:
            errors.append((f"diagnoses.{name}.name", "the name is not an option"))
    if errors:
        raise ConfigError(errors)


def _build(name: str, entry: DiagnosisEntry, options: Mapping[str, Any]) -> Diagnosis:
    """``entry``'s diagnosis with ``options``, pydantic's errors as a :class:`ConfigError`."""
    try:
        return entry.cls(**options)
    except ValidationError as err:
        raise ConfigError(
            [(".".join(["diagnoses", name, *map(str, e["loc"])]), e["msg"]) for e in err.errors()]
        ) from None
