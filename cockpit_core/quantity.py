"""The quantity protocol: what a plugin implements to add a quantity to cockpit.

A quantity is a class with

* ``name``: snake_case identifier, used as config key, output key and panel key;
* ``Config``: a pydantic model (subclass of :class:`QuantityConfig`) with its options;
* ``requirements()``: the statistics, ``info`` keys and loss graph it needs;
* ``compute(ctx)``: the math, reading statistics from the :class:`StepContext`.

Two-step quantities (values that compare two consecutive tracked steps, such as the update
size) subclass :class:`TwoStepQuantity` and implement ``compute_start``/``compute_end``;
the core keeps the start state in its cache and stores the value under the start step.
See ``docs/writing_quantities.md`` for a walk-through.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Union, get_args, get_origin

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cockpit_core.errors import ConfigError
from cockpit_core.plugin.name_table import check_named_class
from cockpit_core.requirements import NO_REQUIREMENTS, Requirements
from cockpit_core.schedules import EveryN, Schedule, ScheduleFn, as_schedule_fn

if TYPE_CHECKING:
    from torch import Tensor

    from cockpit_core.context import StepContext

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
"""Quantity names are snake_case: lower-case words joined by single underscores."""


_SCALAR_NAMES = {bool: "a valid boolean", int: "a valid integer", float: "a valid number"}


def _scalar_types(annotation: Any) -> set[type] | None:
    """The scalar types (bool/int/float/None) an annotation accepts, or ``None`` if it accepts more."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _scalar_types(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        out: set[type] = set()
        for arg in get_args(annotation):
            arg_types = _scalar_types(arg)
            if arg_types is None:
                return None
            out |= arg_types
        return out
    if annotation is type(None) or annotation in _SCALAR_NAMES:
        return {annotation}
    return None


def loose_scalar_message(annotation: Any, value: Any) -> str | None:
    """Why ``value`` is refused for a number/boolean field, or ``None`` if it is not refused.

    Pydantic's default (lax) mode reads ``true`` as ``1``, ``"yes"`` as ``True`` and ``"10"``
    as ``10``. Config files give real numbers and booleans, so those coercions only hide
    mistakes. Fixed-length tuples of numbers (``range = [0, 1]``) are checked item by item.
    Values of other types are left to pydantic.
    """
    if get_origin(annotation) is tuple and isinstance(value, (list, tuple)):
        args = get_args(annotation)
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        for i, (item_type, item) in enumerate(zip(items, value)):
            message = loose_scalar_message(item_type, item)
            if message is not None:
                return f"item {i}: {message}"
        return None
    accepted = _scalar_types(annotation)
    if not accepted or value is None:
        return None
    if isinstance(value, bool):
        ok = bool in accepted
    elif isinstance(value, (int, float)):  # pydantic refuses 2.5 for an int field itself
        ok = int in accepted or float in accepted
    elif isinstance(value, str):
        ok = False
    else:
        return None
    if ok:
        return None
    expected = " or ".join(_SCALAR_NAMES[t] for t in (bool, int, float) if t in accepted)
    if float in accepted:
        expected = expected.replace(f"{_SCALAR_NAMES[int]} or ", "")
    return f"Input should be {expected}, got {type(value).__name__} {value!r}"


class QuantityConfig(BaseModel):
    """Options every quantity has. Subclass it to add a quantity's own options.

    Every field needs a ``description`` and a default; unknown keys are rejected. Number and
    boolean fields, also those of subclasses, are strict: ``every = true`` or
    ``bins = "10"`` is an error, not a coercion.
    """

    model_config = ConfigDict(extra="forbid")

    every: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Track every this many steps (default 1). Shorthand for schedule.",
    )
    offset: int = Field(0, ge=0, strict=True, description="First step tracked by `every`.")
    schedule: Schedule | None = Field(
        None,
        description="When to track, as data: kind 'every', 'log', 'steps' or 'on_finding'.",
    )
    label: str | None = Field(
        None,
        strict=True,
        description="Output key; defaults to the quantity name. Needed to track one "
        "quantity twice with different options.",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_loose_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        message = None if field is None else loose_scalar_message(field.annotation, value)
        if message is not None:
            raise PydanticCustomError("strict_scalar", message)
        return value

    @field_validator("label")
    @classmethod
    def _usable_label(cls, label: str | None) -> str | None:
        if label is not None and (not label.strip() or label.startswith("__")):
            raise ValueError(
                f"label {label!r} cannot be an output key: use a non-empty name that does not "
                "start with '__' (reserved for the log format), e.g. 'grad_norm_2'"
            )
        return label

    @model_validator(mode="after")
    def _one_schedule(self) -> QuantityConfig:
        if self.schedule is not None and (self.every is not None or self.offset != 0):
            raise ValueError("give either 'schedule' or 'every'/'offset', not both")
        return self

    def resolved_schedule(self) -> ScheduleFn:
        """The schedule these options describe (every step if none is given)."""
        if self.schedule is not None:
            return self.schedule
        return EveryN(every=self.every or 1, offset=self.offset)


def validate_config(config_cls: type[BaseModel], data: dict[str, Any], prefix: str = "") -> Any:
    """Validate ``data`` against ``config_cls``; raise :class:`ConfigError` with field paths."""
    try:
        return config_cls.model_validate(data)
    except ValidationError as err:
        errors = pydantic_errors(err, prefix, data)
        if issubclass(config_cls, QuantityConfig):
            errors = _suggest_options(err, errors, config_cls)
        raise ConfigError(errors) from None


def _suggest_options(
    err: ValidationError, errors: list[tuple[str, str]], config_cls: type[BaseModel]
) -> list[tuple[str, str]]:
    """Add the closest valid option name to each unknown top-level quantity option."""
    out = []
    for e, (path, msg) in zip(err.errors(), errors):
        if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
            close = difflib.get_close_matches(str(e["loc"][0]), list(config_cls.model_fields), n=1)
            if close:
                msg = msg.replace(
                    "unknown option", f"unknown option, did you mean '{close[0]}'?", 1
                )
        out.append((path, msg))
    return out


def pydantic_errors(
    err: ValidationError, prefix: str = "", data: Any = None
) -> list[tuple[str, str]]:
    """Turn a pydantic error into ``(dotted.field.path, message)`` pairs.

    Type errors name the value that was given (``Input should be a valid boolean, got str
    'yes'``); ``Value error, `` prefixes of custom validators are dropped. With the validated
    ``data``, the tags pydantic inserts for discriminated unions are dropped from the path
    (``schedule.num``, not ``schedule.log.num``).
    """
    out = []
    for e in err.errors():
        loc = _without_union_tags(e["loc"], data) if data is not None else tuple(e["loc"])
        path = ".".join(str(p) for p in ((prefix,) if prefix else ()) + loc)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown option (check the spelling; `cockpit quantities` lists the options)"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif (e["type"].endswith("_type") or e["type"] == "literal_error") and _is_plain(
            e.get("input")
        ):
            msg = f"{msg}, got {type(e['input']).__name__} {e['input']!r}"
        out.append((path, msg))
    return out


def _without_union_tags(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Drop the ``kind`` tags of discriminated unions from an error location."""
    out: list[Any] = []
    node, i = data, 0
    while i < len(loc):
        part = loc[i]
        if isinstance(node, dict) and node.get("kind") == part:
            following = loc[i + 1] if i + 1 < len(loc) else None
            if part not in node or following in node:
                i += 1  # the tag, not a key of the input
                continue
        out.append(part)
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
        i += 1
    return tuple(out)


def _is_plain(value: Any) -> bool:
    """Whether ``value`` is a short scalar worth quoting in a message."""
    return isinstance(value, (bool, int, float, str)) and len(repr(value)) <= 60


def layered(total: Any, per_param: Any) -> dict[str, Any]:
    """The per-layer output convention: ``{"total": float, "per_param": float64 array}``.

    The dashboard's per-parameter panels, the sinks and the diagnoses read per-layer values
    in this form, ``per_param`` in the order of ``ctx.param_names``.

    Args:
        total: The value over all parameters (a number or a 0-d tensor).
        per_param: One value per parameter (a tensor, on any device, or a sequence).

    """
    if hasattr(per_param, "detach"):  # a tensor: one transfer to the host
        per_param = per_param.detach().to("cpu").double().numpy()
    return {"total": float(total), "per_param": np.asarray(per_param, dtype=np.float64)}


@dataclass(frozen=True)
class ResumeContext:
    """What a quantity's ``load_state_dict`` (and ``load_start_state``) may need to know.

    Attributes:
        step: The last step of the run that saved the state (``None``: it tracked none).
        params: The tracked parameters of the resumed run, in order.
        param_names: Their names.
        optimizer: The optimizer the Cockpit knows (``Cockpit(..., optimizer=...)``, or
            ``cp.attach(..., optimizer=...)``), else ``None``.

    """

    step: int | None
    params: Sequence[Tensor]
    param_names: Sequence[str]
    optimizer: Any = None


class Quantity:
    """Base class of all quantities tracked at a single step.

    Subclasses set ``name`` and, if they have options, ``Config``; they override
    :meth:`requirements` (or set ``REQUIREMENTS``) and :meth:`compute`.

    Args:
        config: Options as a ``Config`` instance or a dict.
        schedule: A callable ``step -> bool`` overriding the configured schedule.
        **options: Options as keyword arguments (merged over ``config``).

    Raises:
        ConfigError: The options are invalid; the message names each bad field.

    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[QuantityConfig]] = QuantityConfig
    REQUIREMENTS: ClassVar[Requirements] = NO_REQUIREMENTS
    two_step: ClassVar[bool] = False
    STATE_VERSION: ClassVar[int] = 1
    """Version of the layout of :meth:`state_dict` (and of two-step starts); raise it when
    the layout changes: a checkpoint of another version is refused (``cp.load_state_dict``)."""

    def __init__(
        self,
        config: QuantityConfig | dict[str, Any] | None = None,
        *,
        schedule: ScheduleFn | None = None,
        **options: Any,
    ):
        check_quantity_class(type(self))
        if isinstance(config, self.Config) and not options:
            self.config = config
        else:
            data = (
                config.model_dump(exclude_unset=True)
                if isinstance(config, BaseModel)
                else dict(config or {})
            )
            data.update(options)
            self.config = validate_config(self.Config, data, prefix=self.name)
        self.schedule: ScheduleFn = as_schedule_fn(schedule or self.config.resolved_schedule())

    @property
    def key(self) -> str:
        """Output key of this instance: the ``label`` option or the quantity name."""
        return self.config.label or self.name

    def is_active(self, step: int) -> bool:
        """Whether the quantity computes (or starts computing) at ``step``."""
        return bool(self.schedule(step))

    def requirements(self) -> Requirements:
        """What :meth:`compute` needs. Defaults to the class attribute ``REQUIREMENTS``."""
        return self.REQUIREMENTS

    def all_requirements(self) -> list[Requirements]:
        """Requirements of every phase (one for single-step quantities)."""
        return [self.requirements()]

    def required_info(self) -> frozenset[str]:
        """``info`` keys needed at any phase; checked when a step begins."""
        keys: frozenset[str] = frozenset()
        for req in self.all_requirements():
            keys |= req.info
        return keys

    def compute(self, ctx: StepContext) -> Any:
        """Return this step's value (numbers, numpy arrays, dicts/lists of them) or ``None``."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute(ctx).")

    def state_dict(self) -> dict[str, Any]:
        """What this quantity keeps across steps in its own attributes, for a checkpoint.

        Values kept in ``ctx.cache`` and the start state of a two-step quantity are saved
        by the core; override this only for attributes of your own (e.g. a range adapted
        from step to step). Return plain data: tensors, numbers, strings, booleans,
        ``None`` and lists, tuples and dicts of them (``torch.load(weights_only=True)``
        reads nothing else). Default: ``{}``.
        """
        return {}

    def load_state_dict(self, state: dict[str, Any], ctx: ResumeContext) -> None:
        """Restore what :meth:`state_dict` returned, before the resumed run's first step.

        Args:
            state: The dict :meth:`state_dict` returned (of the same :attr:`STATE_VERSION`).
            ctx: The resumed run's parameters, optimizer and last step.

        """

    def __repr__(self) -> str:
        opts = self.config.model_dump(exclude_defaults=True)
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in opts.items())})"


class TwoStepQuantity(Quantity):
    """A quantity that needs a start step and the step after it.

    At a scheduled step ``s`` the core calls :meth:`compute_start` and keeps its result in
    the cross-step cache; at the next step the Cockpit sees, it calls :meth:`compute_end`
    with that state and stores the value under ``s``. The state is dropped right after.
    """

    two_step: ClassVar[bool] = True
    START_REQUIREMENTS: ClassVar[Requirements] = NO_REQUIREMENTS
    END_REQUIREMENTS: ClassVar[Requirements] = NO_REQUIREMENTS

    def start_requirements(self) -> Requirements:
        """What :meth:`compute_start` needs."""
        return self.START_REQUIREMENTS

    def end_requirements(self) -> Requirements:
        """What :meth:`compute_end` needs."""
        return self.END_REQUIREMENTS

    def all_requirements(self) -> list[Requirements]:
        """Requirements of both phases."""
        return [self.start_requirements(), self.end_requirements()]

    def compute_start(self, ctx: StepContext) -> Any:
        """Return the state to keep until the end step (e.g. copies of the parameters)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_start(ctx).")

    def compute_end(self, ctx: StepContext, state: Any) -> Any:
        """Return the value, stored under the start step."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_end(ctx, state).")

    def compute(self, ctx: StepContext) -> Any:  # noqa: D102 - not used for two-step quantities
        raise TypeError("Two-step quantities implement compute_start/compute_end, not compute.")

    def start_state_dict(self, state: Any) -> Any:
        """The start state ``compute_start`` returned, as plain data for a checkpoint.

        Default: ``state`` itself, which must then be plain data (tensors, numbers,
        strings, lists, tuples, dicts). Override it (with :meth:`load_start_state`) when
        the state is an object of your own.
        """
        return state

    def load_start_state(self, data: Any, ctx: ResumeContext) -> Any:
        """The start state again, from what :meth:`start_state_dict` returned.

        ``compute_end`` of the resumed run's first step receives it. Default: ``data``.
        """
        return data


def check_quantity_class(cls: type) -> None:
    """Raise ``TypeError`` with a fix if ``cls`` does not follow the quantity protocol."""
    check_named_class(
        cls,
        Quantity,
        "cockpit_core.Quantity",
        "quantity",
        NAME_PATTERN,
        "grad_norm",
        rule="snake_case (lower-case letters, digits, single underscores)",
    )
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and issubclass(config, QuantityConfig)):
        raise TypeError(f"{cls.__name__}.Config must subclass cockpit_core.QuantityConfig.")
