"""The JSON schema of config files for the installed plugins (for editor autocomplete)."""

from __future__ import annotations

import functools
import operator
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, create_model

from cockpit_core.config.settings import CockpitSettings
from cockpit_core.plugin.registry import Registry


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
    name_type: Any = Literal[tuple(names)] if names else str
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
