"""Quantity entries of a config into Quantity instances, presets expanded.

:func:`resolve_quantities` turns names, presets, option dicts, classes and instances into
:class:`~cockpit_core.quantity.Quantity` instances, reporting every problem with its field
path; :func:`key_collisions` finds quantities that would write the same output key.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Union

from cockpit_core.diagnosing.triggers import trigger_errors
from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.errors import ConfigError, DuplicateNameError, UnknownNameError
from cockpit_core.plugin.registry import Registry
from cockpit_core.quantity import Quantity, validate_config

QuantitySpec = Union[str, dict[str, Any], Quantity, type]
"""A quantity name, preset name, option dict, Quantity instance or Quantity class."""

RESERVED_KEY_MESSAGE = (
    f"the output key '{METRICS_KEY}' is reserved for the metrics of cp.log(step, ...); "
    "give this quantity another 'label'"
)


def resolve_quantities(
    spec: QuantitySpec | Iterable[QuantitySpec],
    registry: Registry,
    source: str | None = None,
    diagnoses: Collection[str] | None = None,
) -> list[Quantity]:
    """Turn names, presets, dicts, classes and instances into Quantity instances.

    Args:
        spec: A preset name or a list of entries (``Cockpit(params, quantities)``).
        registry: Where names are looked up.
        source: The file the entries come from (named in the error message).
        diagnoses: The names of the diagnoses that run while training
            (``Cockpit(..., diagnoses=...)``): an ``on_finding`` schedule must name one of
            them. ``None``: only checked to name installed diagnoses.

    Raises:
        ConfigError: One entry per problem, each with its field path (``quantities.2.bins``)
            and, for unknown names, the closest installed name; also when two quantities
            would write the same output key, or an ``on_finding`` schedule names a diagnosis
            that is not installed or (given ``diagnoses``) does not run.

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
    installed = diagnosis_names(registry)
    for path, q in zip(paths, out):
        errors.extend(trigger_errors(q, path, installed, diagnoses))
    if errors:
        raise ConfigError(errors, source)
    return out


def diagnosis_names(registry: Registry) -> list[str]:
    """The names of the diagnoses installed in ``registry``."""
    return [name for name, _ in registry.diagnoses.items()]


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
        if q.key == METRICS_KEY:
            errors.append((path, RESERVED_KEY_MESSAGE))
        elif q.key in seen:
            where = "within this entry" if seen[q.key] == path else f"also {seen[q.key]}"
            errors.append(
                (path, f"'{q.key}' is tracked twice ({where}); give one of them a distinct 'label'")
            )
        seen.setdefault(q.key, path)
    return errors


def quantity_entry(quantity: Quantity) -> dict[str, Any]:
    """How the log header lists a quantity: ``name``, output ``key``, non-default options."""
    return {
        "name": quantity.name,
        "key": quantity.key,
        **quantity.config.model_dump(mode="json", exclude_defaults=True),
    }


def resolve_added_quantity(
    entry: QuantitySpec, existing: Iterable[Quantity], registry: Registry
) -> Quantity:
    """Resolve the one quantity of ``cp.add(entry)``, checked like a constructor entry.

    Args:
        entry: A quantity name, an option dict, a Quantity class or instance (what one
            entry of the constructor's ``quantities`` list may be, except a preset).
        existing: The quantities the Cockpit tracks already.
        registry: Where names are looked up.

    Raises:
        ConfigError: As the constructor raises it (unknown name with the closest installed
            one, bad options with their field path, a key already tracked or reserved),
            from source ``cp.add(...)`` with the path ``quantity``; also for a preset, or
            an ``on_finding`` schedule that names a diagnosis that is not installed.

    """
    path, source = "quantity", "cp.add(...)"
    name = entry.get("name") if isinstance(entry, dict) else entry
    if isinstance(name, str) and name in registry.presets:
        members = [str(m) for m in registry.presets[name].quantities]
        raise ConfigError(
            [
                (
                    path,
                    f"'{name}' is a preset of {len(members)} quantities; cp.add takes one "
                    f"quantity: add them one by one (for name in {members}: cp.add(name))",
                )
            ],
            source,
        )
    try:
        (quantity,) = _resolve_one(entry, registry, path, seen_presets=())
    except ConfigError as err:
        raise ConfigError(err.errors, source) from None
    if quantity.key == METRICS_KEY:
        raise ConfigError([(path, RESERVED_KEY_MESSAGE)], source)
    errors = trigger_errors(quantity, path, diagnosis_names(registry))
    if errors:
        raise ConfigError(errors, source)
    if any(q.key == quantity.key for q in existing):
        raise ConfigError(
            [
                (
                    path,
                    f"'{quantity.key}' is already tracked; give the added one a distinct "
                    f"'label', e.g. cp.add({{'name': '{quantity.name}', 'label': "
                    f"'{quantity.key}_2'}})",
                )
            ],
            source,
        )
    return quantity


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
    except (UnknownNameError, DuplicateNameError) as err:
        raise ConfigError([(name_path, str(err))]) from None
    config = validate_config(cls.Config, options, prefix=path)
    return cls(config)


def _expand_preset(
    name: str, registry: Registry, path: str, seen: tuple[str, ...]
) -> list[Quantity]:
    if name in seen:
        raise ConfigError([(path, f"preset '{name}' includes itself")])
    preset = registry.preset(name)
    out: list[Quantity] = []
    errors: list[tuple[str, str]] = []
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
