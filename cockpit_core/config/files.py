"""Configuration: quantities declared by name, in Python or in a TOML/YAML/JSON file.

A config file holds (TOML shown; YAML and JSON have the same structure)::

    on_error = "warn"
    quantities = [
        "loss",
        { name = "hess_max_ev", every = 10 },
        { name = "grad_hist_1d", bins = 80, schedule = { kind = "log", end = 1000 } },
    ]

``quantities`` may also be a preset name (``quantities = "economy"``), and preset names may
appear inside the list. Every error names the exact field path (``quantities.2.bins``).

One validation path: :func:`validate_config_data` checks everything a file can get wrong
(top-level options, quantity entries and their options, output-key collisions, sink names and
options, provider names) and reports all problems at once. ``cockpit validate``,
``parse_settings(data, source, registry)`` and ``Cockpit.from_config`` go through it.

The parts live in their own modules and are importable from here: the top-level options
(:mod:`cockpit_core.config.settings`), resolving quantity entries and presets
(:mod:`cockpit_core.config.quantities`), the whole-file validation
(:mod:`cockpit_core.config.validation`) and the JSON schema
(:mod:`cockpit_core.config.schema`). This module reads config files and checks options.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cockpit_core.config.limits import LimitError, loads_json, loads_toml, loads_yaml
from cockpit_core.config.quantities import (
    QuantitySpec,
    check_unique_keys,
    key_collisions,
    resolve_quantities,
)
from cockpit_core.config.schema import config_json_schema
from cockpit_core.config.settings import CockpitSettings, OnError, SinkEntrySpec
from cockpit_core.config.validation import ValidatedConfig, ValidatedSink, validate_config_data
from cockpit_core.errors import ConfigError
from cockpit_core.plugin.registry import Registry
from cockpit_core.quantity import validate_config

try:  # Python 3.11+
    import tomllib as _toml
except ImportError:  # Python 3.10: tomli is the same parser, released separately
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ImportError:
        _toml = None  # type: ignore[assignment]

TOML_MISSING = (
    "reading a .toml file needs Python 3.11+ or the 'tomli' package: run `pip install tomli`, "
    "or write the config as .yaml or .json"
)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file into a dict.

    A TOML or YAML file may hold the options at the top level or under a ``cockpit`` table.
    A file beyond the limits of :mod:`cockpit_core.config.limits` (nesting deeper than
    :data:`~cockpit_core.config.limits.MAX_DEPTH` levels, a YAML document whose aliases
    expand to more than :data:`~cockpit_core.config.limits.MAX_VALUES` values, an integer
    too long for Python) is refused with a :class:`ConfigError` naming the limit.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError([("", f"config file not found: {path}")])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError([("", f"cannot read the file: {err}")], str(path)) from None
    suffix = path.suffix.lower()
    parse_errors: tuple[type[Exception], ...] = (yaml.YAMLError, json.JSONDecodeError)
    if _toml is not None:
        parse_errors += (_toml.TOMLDecodeError,)
    try:
        if suffix == ".toml":
            if _toml is None:
                raise ConfigError([("", TOML_MISSING)], str(path))
            data = loads_toml(text, _toml)
        elif suffix in (".yaml", ".yml"):
            data = loads_yaml(text)
        elif suffix == ".json":
            data = loads_json(text)
        else:
            raise ConfigError(
                [("", f"unsupported config file type '{suffix}': use .toml, .yaml, .yml or .json")],
                str(path),
            )
    except LimitError as err:  # nesting, size of the expanded YAML, digits of a number
        raise ConfigError([("", f"refused: {err}")], str(path)) from None
    except parse_errors as err:
        raise ConfigError([("", f"cannot parse: {err}")], str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", "the file must hold a table/mapping of options")], str(path))
    if set(data) == {"cockpit"} and isinstance(data["cockpit"], dict):
        data = data["cockpit"]
    return data


def parse_settings(
    data: Any, source: str | None = None, registry: Registry | None = None
) -> CockpitSettings:
    """Validate options; raise :class:`ConfigError` listing every problem with its field path.

    Args:
        data: The options (a mapping).
        source: The file they come from, for the message.
        registry: With a registry, the full check of :func:`validate_config_data` runs
            (quantities, output keys, sinks, providers); without one, only the top-level
            options are checked (what ``Cockpit(...)`` needs before it resolves quantities).

    """
    if registry is not None:
        return validate_config_data(data, registry, source).settings
    if not isinstance(data, Mapping):
        raise ConfigError(
            [("", f"expected a mapping of options, got {type(data).__name__}")], source
        )
    try:
        settings: CockpitSettings = validate_config(CockpitSettings, dict(data))
        return settings
    except ConfigError as err:
        raise ConfigError(err.errors, source) from None


__all__ = [
    "TOML_MISSING",
    "CockpitSettings",
    "OnError",
    "QuantitySpec",
    "SinkEntrySpec",
    "ValidatedConfig",
    "ValidatedSink",
    "check_unique_keys",
    "config_json_schema",
    "key_collisions",
    "load_config_file",
    "parse_settings",
    "resolve_quantities",
    "validate_config_data",
]
