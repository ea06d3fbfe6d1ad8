"""The top-level options of a config file: :class:`CockpitSettings`.

Everything but the quantity entries, with strict types (``debug = "yes"`` is an error, not
a silent coercion); :mod:`cockpit_core.config.files` describes the file as a whole.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

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
    provider_options: dict[str, dict[str, Any]] | None = Field(
        None,
        description="Options of individual statistics providers, by provider name, e.g. "
        "{autodiff = {max_hvps = 100000}}; each provider documents its own (docs/providers.md).",
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
    diagnoses: list[str | dict[str, Any]] | None = Field(
        None,
        description="Diagnoses to run while training (names registered by plugins, or "
        "tables with 'name' and the diagnosis's options; null: none); each finding goes to "
        "the log and every sink and is warned about once. See docs/diagnoses.md.",
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
