"""Which diagnoses ``cockpit diagnose`` runs, and with which options.

The list of diagnoses comes from

- ``--config FILE``: the file's ``diagnoses`` entry, options included (the file is read and
  checked as ``cockpit validate`` checks it);
- ``--only NAME,...``: those diagnoses, with default options; together with ``--config``,
  the entries of the config file that ``--only`` names;
- neither: every installed diagnosis, with default options.

``--set NAME.OPTION=VALUE`` (repeatable) then sets an option of every entry of ``NAME`` in
that list (a later ``--set`` of the same option wins); ``NAME`` must be in the list. Each
diagnosis validates its options with its pydantic ``Config`` when it is built
(:func:`cockpit_core.diagnosing.build.build_diagnoses`). See ``docs/diagnoses.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cockpit_core.config.files import load_config_file, validate_config_data
from cockpit_core.config.limits import LimitError, loads_json
from cockpit_core.diagnosis import UnknownDiagnosisError
from cockpit_core.errors import ConfigError
from cockpit_core.plugin.registry import Registry

Spec = str | Mapping[str, Any]
"""A diagnosis as a config names it: its name, or ``{"name": ..., **options}``."""

SET_FORM = "expected NAME.OPTION=VALUE, e.g. --set cost.severity=warning"


def parse_setting(text: str) -> tuple[str, str, Any]:
    """``NAME.OPTION=VALUE`` as ``(name, option, value)``.

    VALUE is read as JSON when it parses (``20``, ``0.5``, ``true``, ``null``, ``"text"``)
    and is the string as given otherwise (``warning``).

    Raises:
        ValueError: ``text`` is not of the form ``NAME.OPTION=VALUE``, or VALUE is JSON
            beyond the limits of :mod:`cockpit_core.config.limits` (nested deeper than
            :data:`~cockpit_core.config.limits.MAX_DEPTH` levels, a number too long).

    """
    key, equals, raw = text.partition("=")
    name, dot, option = key.strip().partition(".")
    if not (equals and dot and name and option):
        raise ValueError(f"--set {text!r}: {SET_FORM}")
    try:
        value = loads_json(raw)
    except LimitError as err:  # deep nesting, a number too long: refused, not a string
        raise ValueError(f"--set {key.strip()!r}: VALUE is {err}") from None
    except ValueError:
        value = raw
    return name, option, value


def options_from_settings(settings: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{name: {option: value}}`` of ``--set`` arguments; a later one wins.

    Raises:
        ValueError: An argument is not of the form ``NAME.OPTION=VALUE``.

    """
    out: dict[str, dict[str, Any]] = {}
    for text in settings:
        name, option, value = parse_setting(text)
        out.setdefault(name, {})[option] = value
    return out


def config_diagnoses(path: str, registry: Registry) -> list[Spec]:
    """The ``diagnoses`` of a config file, read and checked as ``cockpit validate`` does.

    Raises:
        ConfigError: The file cannot be read or is invalid, or it lists no diagnoses.

    """
    data = load_config_file(path)
    specs = validate_config_data(data, registry, path).settings.diagnoses
    if not specs:
        raise ConfigError(
            [
                (
                    "diagnoses",
                    "the file lists no diagnoses for `cockpit diagnose --config`: add e.g. "
                    'diagnoses = ["stability", { name = "cost", severity = "warning" }]',
                )
            ],
            path,
        )
    return list(specs)


def spec_name(spec: Spec) -> Any:
    """The name of a diagnosis entry (``None`` for a table without one)."""
    return spec.get("name") if isinstance(spec, Mapping) else spec


def select_only(
    specs: list[Spec] | None,
    only: Sequence[str] | None,
    registry: Registry,
    source: str | None = None,
) -> list[Spec] | None:
    """The diagnoses to run: ``specs`` (from ``--config``; ``None``: all) narrowed by ``only``.

    Args:
        specs: The config file's diagnoses (``None``: no ``--config``).
        only: The names of ``--only`` (``None``: not given).
        registry: The installed plugins.
        source: The config file (named in the error message).

    Raises:
        UnknownDiagnosisError: A name in ``only`` that no installed plugin registers (only
            checked here with ``specs``; otherwise when the diagnoses are built).
        ConfigError: A name in ``only`` that ``specs`` does not list.

    """
    if only is None:
        return specs
    if specs is None:
        return list(only)
    listed = [spec_name(s) for s in specs]
    missing = [name for name in only if name not in listed]
    for name in missing:
        if registry.diagnoses.lookup(name) is None:
            raise UnknownDiagnosisError(name, list(registry.diagnoses))
    if missing:
        raise ConfigError(
            [
                (
                    "diagnoses",
                    f"--only names {', '.join(map(repr, missing))}, which the config file "
                    f"does not list (it lists {', '.join(map(str, listed))})",
                )
            ],
            source,
        )
    return [s for s in specs if spec_name(s) in only]
