"""Protocol checks every quantity must pass.

Run them in your plugin's tests::

from cockpit_core.testing import check_quantity

def test_my_quantity_follows_the_protocol():
    check_quantity(MyQuantity)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from cockpit_core.config.files import config_json_schema
from cockpit_core.errors import ConfigError, MissingInfoError
from cockpit_core.log import dumps, loads
from cockpit_core.plugin.registry import Registry
from cockpit_core.quantity import Quantity, check_quantity_class
from cockpit_core.schedules import ExplicitSteps
from cockpit_core.testing.problems import Problem, tiny_mlp
from cockpit_core.testing.runner import run_cockpit

if TYPE_CHECKING:
    from cockpit_core.context import StepContext


class ConformanceError(AssertionError):
    """A quantity does not follow the protocol; the message says which rule and how to fix it."""


def check_quantity(
    cls: type[Quantity],
    options: dict[str, Any] | None = None,
    problem: Problem | None = None,
    steps: int = 4,
    info_extra: dict[str, Any] | None = None,
) -> None:
    """Run every protocol check on ``cls``; raise :class:`ConformanceError` on the first failure.

    Checks: snake_case name; a Config subclass whose fields all have defaults and
    descriptions; unknown options rejected with :class:`ConfigError`; a JSON schema; nothing
    computed on unscheduled steps; values produced on scheduled steps (stored under the
    start step for two-step quantities); values that survive the log's encode/decode round
    trip; no undeclared statistic or missing ``info`` key read (every exception ``compute``
    raises becomes a :class:`ConformanceError` naming it, the original chained).

    Args:
        cls: The quantity class.
        options: Options for the instances under test (defaults otherwise).
        problem: The problem to train (default: :func:`tiny_mlp`).
        steps: Steps to train (at least 3).
        info_extra: Extra ``info`` keys the quantity reads (see :func:`run_cockpit`).

    Raises:
        ConformanceError: The first rule ``cls`` breaks, with the fix.

    """
    options = dict(options or {})
    try:
        check_quantity_class(cls)
    except TypeError as err:
        raise ConformanceError(str(err)) from None
    _check_config(cls, options)
    _check_schema(cls)
    _check_schedule_and_values(cls, options, problem or tiny_mlp(), steps, info_extra)


def _check_config(cls: type[Quantity], options: dict[str, Any]) -> None:
    for name, field in cls.Config.model_fields.items():
        if field.is_required():
            raise ConformanceError(f"{cls.__name__}.Config.{name} has no default; give it one.")
        if not field.description:
            raise ConformanceError(
                f"{cls.__name__}.Config.{name} has no description; use Field(..., description=...)."
            )
    try:
        cls(**options)
    except ConfigError as err:
        raise ConformanceError(
            f"{cls.__name__}({options}) rejects its own options: {err}"
        ) from None
    try:
        cls(**options, this_option_does_not_exist=1)
    except ConfigError:
        pass
    else:
        raise ConformanceError(
            f"{cls.__name__} accepts unknown options; its Config must keep extra='forbid'."
        )


def _check_schema(cls: type[Quantity]) -> None:
    registry = Registry()
    module = type("_Plugin", (), {})()
    from cockpit_core.hookspecs import RegisterQuantity, hookimpl

    @hookimpl
    def register_quantities(register: RegisterQuantity) -> None:
        register(cls)

    module.register_quantities = register_quantities
    info = registry.add_plugin(module, name=f"conformance-{cls.name}")
    if not info.ok:
        raise ConformanceError(f"registering {cls.__name__} failed: {info.error}")
    schema = config_json_schema(registry)
    if cls.name not in str(schema):
        raise ConformanceError(f"the config JSON schema does not mention '{cls.name}'.")


def _check_schedule_and_values(
    cls: type[Quantity],
    options: dict[str, Any],
    problem: Problem,
    steps: int,
    info_extra: dict[str, Any] | None = None,
) -> None:
    tracked = 1
    quantity = cls(**options, schedule=ExplicitSteps(steps=[tracked]))
    calls: list[tuple[str, int]] = []
    _spy(quantity, calls)
    try:
        result = run_cockpit(
            problem,
            [quantity],
            steps=steps,
            on_error="raise",
            info_extra=info_extra,
        )
    except Exception as err:
        raise ConformanceError(_run_failure(cls, problem, err)) from err
    called_steps = {s for _, s in calls}
    expected_calls = {tracked, tracked + 1} if cls.two_step else {tracked}
    if called_steps != expected_calls:
        raise ConformanceError(
            f"{cls.__name__} computed at steps {sorted(called_steps)}, but it is scheduled only "
            f"for step {tracked} (expected calls at {sorted(expected_calls)})."
        )
    output = result.output
    if set(output) - {tracked}:
        raise ConformanceError(
            f"{cls.__name__} stored values at steps {sorted(output)}; only step {tracked} is scheduled."
        )
    if tracked not in output or quantity.key not in output[tracked]:
        raise ConformanceError(f"{cls.__name__} produced no value at its scheduled step {tracked}.")
    value = output[tracked][quantity.key]
    try:
        back = loads(dumps({"v": value}))["v"]
    except Exception as err:
        raise ConformanceError(
            f"{cls.__name__}'s value {value!r} cannot be written to the log ({err}); return "
            "numbers, strings, numpy arrays, or lists/dicts of them."
        ) from None
    if not _equal(value, back):
        raise ConformanceError(
            f"{cls.__name__}'s value changes in a log round trip: {value!r} -> {back!r}"
        )
    if result.cockpit.errors:
        raise ConformanceError(f"{cls.__name__} recorded errors: {result.cockpit.errors}")


def _run_failure(cls: type[Quantity], problem: Problem, err: Exception) -> str:
    """Say why tracking ``cls`` on ``problem`` failed and how to fix it."""
    where = f"{cls.__name__} failed while tracked on the '{problem.name}' problem"
    if isinstance(err, MissingInfoError):
        return (
            f"{where}: {err} check_quantity passes info with loss, individual_losses, "
            "batch_size and optimizer; give other keys with check_quantity(..., info_extra={...})."
        )
    if isinstance(err, KeyError):
        detail = err.args[0] if len(err.args) == 1 else err
        if isinstance(detail, str) and "requirements()" in detail:
            return f"{where}: {detail}"
        return (
            f"{where}: KeyError {detail!r}. If compute reads ctx.info[{detail!r}], declare the "
            f"key in its requirements (Requirements(info={{{detail!r}}})) so a run without it "
            "fails with a clear MissingInfoError, and pass it with "
            "check_quantity(..., info_extra={...}); statistics are read with ctx.stat(...) "
            "after declaring them in Requirements(statistics=...)."
        )
    return f"{where}: {type(err).__name__}: {err}"


def _spy(quantity: Quantity, calls: list[tuple[str, int]]) -> None:
    for method in ("compute", "compute_start", "compute_end"):
        original = getattr(quantity, method, None)
        if original is None:
            continue

        def wrapped(
            ctx: StepContext,
            *args: Any,
            _original: Callable[..., Any] = original,
            _method: str = method,
        ) -> Any:
            calls.append((_method, ctx.step))
            return _original(ctx, *args)

        setattr(quantity, method, wrapped)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_equal, a, b))
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=True)
        )
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return bool(a == b)
