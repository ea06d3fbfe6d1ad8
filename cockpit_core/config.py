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
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, field_validator
from pydantic_core import PydanticCustomError

from cockpit_core.errors import ConfigError, DuplicateQuantityError, UnknownQuantityError
from cockpit_core.quantity import Quantity, validate_config
from cockpit_core.registry import Registry

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

OnError = Literal["warn", "disable", "raise"]


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _sink_shape(entry: Any) -> Any:
    """Refuse sink entries that are neither a name nor a table with a string ``name``."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict):
        if "name" not in entry:
            raise PydanticCustomError("sink_entry", "missing 'name': which sink is this?")
        if isinstance(entry["name"], str):
            return entry
    raise PydanticCustomError(
        "sink_entry",
        "expected a sink name or a table with 'name' and the sink's options, got {got}",
        {"got": _describe(entry if not isinstance(entry, dict) else entry["name"])},
    )


SinkEntrySpec = Annotated[Union[str, dict[str, Any]], BeforeValidator(_sink_shape)]
"""A sink in a config: a registered name or ``{"name": ..., **options}``."""


class CockpitSettings(BaseModel):
    """Top-level options of a Cockpit (everything but the quantity entries).

    Booleans, numbers and paths are strict: ``debug = "yes"`` or ``live_every = true`` is an
    error instead of a silent coercion.
    """

    model_config = ConfigDict(extra="forbid")

    quantities: str | list[Any] = Field(
        "economy",
        description="A preset name, or a list of quantity names, presets and option dicts.",
    )
    on_error: OnError = Field(
        "warn",
        description="When a quantity raises: 'warn' (record, warn, keep tracking it), "
        "'disable' (record, warn, stop tracking it) or 'raise' (re-raise).",
    )
    debug: bool = Field(False, strict=True, description="Print what is computed at each step.")
    log: str | None = Field(
        None,
        strict=True,
        description="Path of a JSON Lines log that receives every record as it is computed.",
    )
    keep_in_memory: bool = Field(
        True,
        strict=True,
        description="Keep values in memory for get_output(); False streams them to the log only.",
    )
    log_fsync_every: float | None = Field(
        5.0,
        ge=0,
        strict=True,
        description="Seconds between fsyncs of the log (0: every record, null: never); every "
        "record is flushed regardless.",
    )
    sinks: list[SinkEntrySpec] = Field(
        default_factory=list,
        description="Extra destinations of every record: sink names registered by plugins, or "
        "tables with 'name' and the sink's options.",
    )
    live_plot: str | None = Field(
        None, strict=True, description="Path of a dashboard picture refreshed while training runs."
    )
    live_every: int = Field(
        50, ge=1, strict=True, description="Steps between refreshes of live_plot."
    )
    backend: str | list[str] = Field(
        "auto",
        description="Which statistics providers compute the statistics: 'auto' (per "
        "parameter and statistic the cheapest installed provider that supports it), a "
        "provider name ('hooks', 'backpack', 'func', or a plugin's) or a list of names in "
        "order of preference. See docs/any_model.md and docs/providers.md.",
    )
    chunk_size: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Samples per torch.func pass (bounds its memory); null: the whole batch.",
    )
    distributed: Literal["auto", "off"] = Field(
        "auto",
        description="'auto': under torch.distributed with several processes, quantities "
        "describe the global batch (statistics are combined across processes); 'off': each "
        "process reports its own mini-batch.",
    )
    write_on: Literal["rank0", "all"] = Field(
        "rank0",
        description="Which processes write the log, sinks and live plot under "
        "torch.distributed: 'rank0' (only process 0) or 'all'.",
    )

    @field_validator("quantities", mode="before")
    @classmethod
    def _quantities_shape(cls, value: Any) -> Any:
        if isinstance(value, (str, list, tuple)):
            return list(value) if isinstance(value, tuple) else value
        raise PydanticCustomError(
            "quantities_shape",
            "expected a preset name or a list of quantity names, presets and option tables, "
            "got {got}",
            {"got": _describe(value)},
        )

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_shape(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise PydanticCustomError(
            "backend_shape",
            "expected 'auto', a provider name or a list of provider names, got {got}",
            {"got": _describe(value)},
        )


@dataclass(frozen=True)
class ValidatedSink:
    """A sink entry of a config that names an installed sink with valid options.

    Attributes:
        path: Where the entry is in the config (``sinks.0``).
        name: The registered sink name.
        options: The validated options (defaults filled in).

    """

    path: str
    name: str
    options: dict[str, Any]


@dataclass(frozen=True)
class ValidatedConfig:
    """A config that passed every check of :func:`validate_config_data`.

    Attributes:
        settings: The top-level options.
        quantities: The quantities the config declares, presets expanded.
        sinks: The sinks the config declares (not built yet: building may open files).

    """

    settings: CockpitSettings
    quantities: list[Quantity]
    sinks: list[ValidatedSink]


def validate_config_data(
    data: Any, registry: Registry, source: str | None = None
) -> ValidatedConfig:
    """Run every check a config can fail and report all problems at once.

    This is the one validation path of cockpit: ``cockpit validate``,
    ``parse_settings(..., registry=...)`` and ``Cockpit.from_config`` use it. It checks the
    top-level options (strict types), every quantity entry and its options against the
    installed plugins, that no two quantities write the same output key, every sink name and
    its options, and the provider names of ``backend``. Nothing is built or opened.

    Args:
        data: The options, e.g. from :func:`load_config_file`.
        registry: The plugins that provide quantities, sinks and providers.
        source: The file the options come from (named in the error message).

    Raises:
        ConfigError: One ``(field path, message)`` pair per problem, in the order of the
            options in ``data``.

    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            [("", f"expected a mapping of options, got {type(data).__name__}")], source
        )
    data = dict(data)
    errors: list[tuple[str, str]] = []
    settings: CockpitSettings | None = None
    try:
        settings = validate_config(CockpitSettings, data)
    except ConfigError as err:
        errors.extend(err.errors)
    bad = {path.split(".")[0] for path, _ in errors}  # fields whose shape is already wrong

    quantities: list[Quantity] = []
    if "quantities" not in bad:
        try:
            quantities = resolve_quantities(data.get("quantities", "economy"), registry)
        except ConfigError as err:
            errors.extend(err.errors)

    sinks: list[ValidatedSink] = []
    raw_sinks = data.get("sinks", [])
    if isinstance(raw_sinks, list):
        for i, entry in enumerate(raw_sinks):
            if any(p == f"sinks.{i}" or p.startswith(f"sinks.{i}.") for p, _ in errors):
                continue  # the entry's shape was reported above
            try:
                sinks.append(_validate_sink(entry, registry, f"sinks.{i}"))
            except ConfigError as err:
                errors.extend(err.errors)

    if "backend" not in bad:
        from cockpit_core.statistics.router import order

        try:
            order(
                {name: entry.cls for name, entry in registry.providers.items()},
                data.get("backend", "auto"),
            )
        except ConfigError as err:
            errors.extend(err.errors)

    if errors or settings is None:
        errors.sort(key=lambda e: _position(e[0], data))  # stable: ties keep check order
        raise ConfigError(errors, source)
    return ValidatedConfig(settings, quantities, sinks)


def _position(path: str, data: Any) -> tuple[int, ...]:
    """Where ``path`` (``quantities.2.bins``) is in ``data``, to sort errors in file order."""
    out = []
    node = data
    for part in path.split(".") if path else ():
        if isinstance(node, dict):
            keys = [str(k) for k in node]
            index = keys.index(part) if part in keys else len(keys)
            node = node.get(part)
        elif isinstance(node, (list, tuple)) and part.isdigit():
            index = int(part)
            node = node[index] if index < len(node) else None
        else:
            break
        out.append(index)
    return tuple(out)


def _validate_sink(entry: Any, registry: Registry, path: str) -> ValidatedSink:
    name = entry if isinstance(entry, str) else entry["name"]
    name_path = path if isinstance(entry, str) else f"{path}.name"
    try:
        sink = registry.sink_entry(name)
    except (UnknownQuantityError, DuplicateQuantityError) as err:
        raise ConfigError([(name_path, str(err))]) from None
    options = {} if isinstance(entry, str) else {k: v for k, v in entry.items() if k != "name"}
    return ValidatedSink(path, name, sink.validate(options, prefix=path))


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file into a dict.

    A TOML or YAML file may hold the options at the top level or under a ``cockpit`` table.
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
            data = _toml.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(
                [("", f"unsupported config file type '{suffix}': use .toml, .yaml, .yml or .json")],
                str(path),
            )
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
        return validate_config(CockpitSettings, dict(data))
    except ConfigError as err:
        raise ConfigError(err.errors, source) from None


QuantitySpec = Union[str, dict[str, Any], Quantity, type]
"""A quantity name, preset name, option dict, Quantity instance or Quantity class."""


def resolve_quantities(
    spec: QuantitySpec | Iterable[QuantitySpec], registry: Registry, source: str | None = None
) -> list[Quantity]:
    """Turn names, presets, dicts, classes and instances into Quantity instances.

    Raises:
        ConfigError: One entry per problem, each with its field path (``quantities.2.bins``)
            and, for unknown names, the closest installed name; also when two quantities
            would write the same output key.

    """
    errors: list[tuple[str, str]] = []
    out: list[Quantity] = []
    paths: list[str] = []
    if isinstance(spec, (str, dict, Quantity, type)):
        entries: list[Any] = [spec]
    elif isinstance(spec, Iterable):
        entries = list(spec)
    else:
        raise ConfigError(
            [
                (
                    "quantities",
                    f"expected a preset name or a list of quantities, got {type(spec).__name__}",
                )
            ],
            source,
        )
    for i, entry in enumerate(entries):
        path = f"quantities.{i}" if not isinstance(spec, (str, dict)) else "quantities"
        try:
            resolved = _resolve_one(entry, registry, path, seen_presets=())
        except ConfigError as err:
            errors.extend(err.errors)
        else:
            out.extend(resolved)
            paths.extend([path] * len(resolved))
    errors.extend(key_collisions(out, paths))
    if errors:
        raise ConfigError(errors, source)
    return out


def key_collisions(
    quantities: list[Quantity], paths: list[str] | None = None
) -> list[tuple[str, str]]:
    """``(path, message)`` for every quantity whose output key an earlier one already writes.

    Args:
        quantities: The quantities in config order.
        paths: Where each quantity is in the config (default ``quantities.<index>``).

    """
    paths = paths if paths is not None else [f"quantities.{i}" for i in range(len(quantities))]
    seen: dict[str, str] = {}
    errors = []
    for path, q in zip(paths, quantities):
        if q.key in seen:
            where = "within this entry" if seen[q.key] == path else f"also {seen[q.key]}"
            errors.append(
                (path, f"'{q.key}' is tracked twice ({where}); give one of them a distinct 'label'")
            )
        seen.setdefault(q.key, path)
    return errors


def check_unique_keys(quantities: list[Quantity], source: str | None = None) -> None:
    """Raise :class:`ConfigError` if two quantities would write the same output key."""
    errors = key_collisions(quantities)
    if errors:
        raise ConfigError(errors, source)


def _resolve_one(
    entry: Any, registry: Registry, path: str, seen_presets: tuple[str, ...]
) -> list[Quantity]:
    if isinstance(entry, Quantity):
        return [entry]
    if isinstance(entry, type) and issubclass(entry, Quantity):
        return [entry()]
    if isinstance(entry, str):
        if entry in registry.presets:
            return _expand_preset(entry, registry, path, seen_presets)
        return [_instantiate(entry, {}, registry, path, path)]
    if isinstance(entry, dict):
        if "name" not in entry:
            raise ConfigError([(path, "missing 'name': which quantity is this?")])
        name = entry["name"]
        if not isinstance(name, str):
            raise ConfigError([(f"{path}.name", "must be a string")])
        options = {k: v for k, v in entry.items() if k != "name"}
        if name in registry.presets:
            if options:
                raise ConfigError([(path, f"preset '{name}' takes no options")])
            return _expand_preset(name, registry, path, seen_presets)
        return [_instantiate(name, options, registry, path, f"{path}.name")]
    raise ConfigError(
        [
            (
                path,
                f"expected a quantity name, an option dict or a Quantity, got {type(entry).__name__}",
            )
        ]
    )


def _instantiate(
    name: str, options: dict[str, Any], registry: Registry, path: str, name_path: str
) -> Quantity:
    try:
        cls = registry.get(name)
    except (UnknownQuantityError, DuplicateQuantityError) as err:
        raise ConfigError([(name_path, str(err))]) from None
    config = validate_config(cls.Config, options, prefix=path)
    return cls(config)


def _expand_preset(
    name: str, registry: Registry, path: str, seen: tuple[str, ...]
) -> list[Quantity]:
    if name in seen:
        raise ConfigError([(path, f"preset '{name}' includes itself")])
    preset = registry.preset(name)
    out, errors = [], []
    for member in preset.quantities:
        try:
            out.extend(_resolve_one(member, registry, path, seen + (name,)))
        except ConfigError as err:
            errors.extend(
                (p, f"preset '{name}' (from {preset.distribution}): {m}") for p, m in err.errors
            )
    if errors:
        raise ConfigError(errors)
    return out


def config_json_schema(registry: Registry) -> dict[str, Any]:
    """JSON schema of a config file for the installed plugins (for editor autocomplete).

    Quantity entries form a discriminated union on ``name``.
    """
    entries = []
    for name in registry.names():
        cls = registry.get(name)
        fields: dict[str, Any] = {  # copies: the schema needs fields, not validators
            key: (info.annotation, info) for key, info in cls.Config.model_fields.items()
        }
        fields["name"] = (Literal[name], Field(description="Quantity name."))
        entry = create_model(
            f"{cls.__name__}Entry",
            __config__=ConfigDict(extra="forbid"),
            __doc__=(cls.__doc__ or name).strip().splitlines()[0],
            **fields,
        )
        entries.append(entry)
    names = registry.names() + sorted(registry.presets)
    name_type = Literal[tuple(names)] if names else str  # type: ignore[valid-type]
    if len(entries) > 1:
        entry_type: Any = Annotated[
            functools.reduce(operator.or_, entries), Field(discriminator="name")
        ]
    elif entries:
        entry_type = entries[0]
    else:
        entry_type = dict[str, Any]
    model = create_model(
        "CockpitConfig",
        __base__=CockpitSettings,
        quantities=(
            Union[name_type, list[name_type | entry_type]],
            Field("economy", description=CockpitSettings.model_fields["quantities"].description),
        ),
    )
    return model.model_json_schema()
