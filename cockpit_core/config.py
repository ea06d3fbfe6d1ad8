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
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import tomllib
import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model

from cockpit_core.errors import ConfigError, DuplicateQuantityError, UnknownQuantityError
from cockpit_core.quantity import Quantity, validate_config
from cockpit_core.registry import Registry

OnError = Literal["warn", "disable", "raise"]


class CockpitSettings(BaseModel):
    """Top-level options of a Cockpit (everything but the quantity entries)."""

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
    debug: bool = Field(False, description="Print what is computed at each step.")
    log: str | None = Field(
        None, description="Path of a JSON Lines log that receives every record as it is computed."
    )
    keep_in_memory: bool = Field(
        True,
        description="Keep values in memory for get_output(); False streams them to the log only.",
    )
    log_fsync_every: float | None = Field(
        5.0,
        ge=0,
        description="Seconds between fsyncs of the log (0: every record, null: never); every "
        "record is flushed regardless.",
    )
    sinks: list[str | dict[str, Any]] = Field(
        default_factory=list,
        description="Extra destinations of every record: sink names registered by plugins, or "
        "tables with 'name' and the sink's options.",
    )
    live_plot: str | None = Field(
        None, description="Path of a dashboard picture refreshed while training runs."
    )
    live_every: int = Field(50, ge=1, description="Steps between refreshes of live_plot.")
    backend: Literal["auto", "backpack", "func"] = Field(
        "auto",
        description="Source of per-sample statistics: 'auto' (BackPACK for the modules it "
        "supports, torch.func for the others once cp.attach(model, loss_fn) was called), "
        "'backpack' (BackPACK only) or 'func' (torch.func for every parameter; needs "
        "cp.attach). See docs/any_model.md.",
    )
    chunk_size: int | None = Field(
        None,
        ge=1,
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


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file into a dict.

    A TOML or YAML file may hold the options at the top level or under a ``cockpit`` table.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError([("", f"config file not found: {path}")])
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(
                [("", f"unsupported config file type '{suffix}': use .toml, .yaml, .yml or .json")],
                str(path),
            )
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as err:
        raise ConfigError([("", f"cannot parse: {err}")], str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", "the file must hold a table/mapping of options")], str(path))
    if set(data) == {"cockpit"} and isinstance(data["cockpit"], dict):
        data = data["cockpit"]
    return data


def parse_settings(data: Any, source: str | None = None) -> CockpitSettings:
    """Validate top-level options; raise :class:`ConfigError` with field paths."""
    if not isinstance(data, dict):
        raise ConfigError(
            [("", f"expected a mapping of options, got {type(data).__name__}")], source
        )
    try:
        return validate_config(CockpitSettings, data)
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
            and, for unknown names, the closest installed name.

    """
    errors: list[tuple[str, str]] = []
    out: list[Quantity] = []
    entries = [spec] if isinstance(spec, (str, dict, Quantity, type)) else list(spec)
    for i, entry in enumerate(entries):
        path = f"quantities.{i}" if not isinstance(spec, (str, dict)) else "quantities"
        try:
            out.extend(_resolve_one(entry, registry, path, seen_presets=()))
        except ConfigError as err:
            errors.extend(err.errors)
    if errors:
        raise ConfigError(errors, source)
    return out


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
        entry = create_model(
            f"{cls.__name__}Entry",
            __base__=cls.Config,
            __doc__=(cls.__doc__ or name).strip().splitlines()[0],
            name=(Literal[name], Field(description="Quantity name.")),
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
