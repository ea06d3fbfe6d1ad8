"""The entries of the registry's tables, each with the distribution that registered it.

:class:`ClassEntry` (a quantity, provider or diagnosis class; ``QuantityEntry``,
``ProviderEntry`` and ``DiagnosisEntry`` name its three uses), :class:`Preset`,
:class:`SinkEntry` (which validates a sink's options before building it),
:class:`RendererEntry` and :class:`CommandEntry`.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from pydantic import BaseModel

from cockpit_core.diagnosis import Diagnosis
from cockpit_core.errors import ConfigError
from cockpit_core.plugin.name_table import check_named_class
from cockpit_core.quantity import NAME_PATTERN, Quantity, loose_scalar_message, validate_config
from cockpit_core.statistics.provider import StatisticProvider

C = TypeVar("C")


@dataclass(frozen=True)
class ClassEntry(Generic[C]):
    """A registered class (quantity, provider or diagnosis) and the distribution it comes from.

    Its name is the class's own ``name`` attribute (checked when it was registered).
    """

    cls: type[C]
    distribution: str
    version: str

    @property
    def name(self) -> str:
        """The registered name (``name`` class attribute)."""
        return str(cast(Any, self.cls).name)


QuantityEntry = ClassEntry[Quantity]
ProviderEntry = ClassEntry[StatisticProvider]
DiagnosisEntry = ClassEntry[Diagnosis]


@dataclass(frozen=True)
class Preset:
    """A named list of quantity specs (names or config dicts)."""

    name: str
    quantities: tuple[Any, ...]
    description: str
    distribution: str


def check_provider_class(cls: Any) -> None:
    """Raise ``TypeError`` with a fix if ``cls`` does not follow the provider protocol."""
    check_named_class(
        cls,
        StatisticProvider,
        "cockpit_core.StatisticProvider",
        "provider",
        NAME_PATTERN,
        "module_hooks",
    )


@dataclass(frozen=True)
class SinkEntry:
    """A registered sink factory (``register_sinks`` hook) and where it comes from."""

    name: str
    factory: Any
    config: Any
    description: str
    distribution: str

    def validate(self, options: dict[str, Any], prefix: str | None = None) -> dict[str, Any]:
        """Check ``options`` without building the sink; return them with defaults filled in.

        With a ``config`` model the options are validated against it (numbers and booleans
        strictly); without one they must fit the factory's signature.

        Raises:
            ConfigError: Every bad option, with its path (``<prefix>.<option>``).

        """
        prefix = prefix or f"sinks.{self.name}"
        options = dict(options)
        if self.config is None:
            try:
                inspect.signature(self.factory).bind(**options)
            except TypeError as err:
                raise ConfigError(
                    [(prefix, f"invalid options for sink '{self.name}': {err}")]
                ) from None
            except ValueError:  # no introspectable signature: the factory decides
                pass
            return options
        fields = getattr(self.config, "model_fields", {})
        errors = []
        for key, value in options.items():
            message = loose_scalar_message(fields[key].annotation, value) if key in fields else None
            if message is not None:
                errors.append((f"{prefix}.{key}", message))
        try:
            validated: BaseModel = validate_config(self.config, options, prefix=prefix)
        except ConfigError as err:
            flagged = {path for path, _ in errors}
            valid = ", ".join(fields) or "none"
            for path, msg in err.errors:
                key = path[len(prefix) + 1 :].split(".")[0]
                if path in flagged:
                    continue
                if key in options and key not in fields:
                    msg = f"unknown option of sink '{self.name}' (check the spelling; its options: {valid})"
                errors.append((path, msg))
        if errors:
            raise ConfigError(errors)
        return validated.model_dump()

    def make(self, options: dict[str, Any] | None = None, prefix: str | None = None) -> Any:
        """Build the sink, validating ``options`` first (see :meth:`validate`)."""
        return self.factory(**self.validate(dict(options or {}), prefix))


@dataclass(frozen=True)
class RendererEntry:
    """A registered renderer (``register_renderers`` hook): writes runs to one file type.

    ``render(source, path, **options)`` draws ``source`` (a :class:`~cockpit_core.Cockpit`,
    a log path, or a list of them to compare) into ``path``; what it returns when ``path`` is
    ``None`` is up to the renderer (a matplotlib figure, an HTML string).
    """

    name: str
    render: Callable[..., Any]
    description: str
    distribution: str


@dataclass(frozen=True)
class CommandEntry:
    """A registered ``cockpit`` sub-command (``register_commands`` hook).

    ``configure(parser)`` adds the command's arguments to its ``argparse`` parser;
    ``run(args)`` runs it and returns the exit code (``None`` counts as 0).
    """

    name: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    help: str
    distribution: str
