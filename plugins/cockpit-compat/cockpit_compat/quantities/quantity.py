"""Base class of the Cockpit 1.0.2-style quantity classes of :mod:`cockpit_compat`.

A compat quantity computes nothing itself. It holds the options a Cockpit 1.0.2 script
passed (``track_schedule``, ``verbose`` and the quantity's own keywords), translates them
into the options of the native quantity that does the work (:meth:`Quantity.to_native`),
and translates the native values back into Cockpit 1.0.2's output layout
(:meth:`Quantity.to_legacy`) and forward again for plotting a 1.0.2-layout log
(:meth:`Quantity.from_legacy`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

from cockpit_core.errors import ConfigError
from cockpit_core.plugin.registry import Registry, default_registry
from cockpit_core.quantity import Quantity as NativeQuantity
from cockpit_core.schedules import EveryN, ExplicitSteps, Logarithmic

DROP = object()
"""Returned by :meth:`Quantity.to_legacy` for a native value Cockpit 1.0.2 would not store."""

_SCHEDULE_MODELS = (EveryN, Logarithmic, ExplicitSteps)


class OutputSource(Protocol):
    """What a quantity is bound to: the Cockpit whose output it reads (:meth:`Quantity.bind`).

    :class:`cockpit_compat.Cockpit` is one; the quantities need no more of it.
    """

    def get_output(self) -> Mapping[int, Mapping[str, Any]]:
        """``{step: {key: value}}`` of every tracked quantity."""
        ...


class Quantity:
    """A Cockpit 1.0.2 quantity, computed by the native quantity ``native_name``.

    Args:
        track_schedule: ``global_step -> bool``: when the quantity is computed (e.g.
            :func:`cockpit_compat.utils.schedules.linear`).
        verbose: Print each value when it is stored (``[Step s | Name]: Store iteration
            s, value ...``).

    Raises:
        TypeError: ``track_schedule`` is not callable.
        ValueError: An option has no native counterpart or a value the native quantity
            refuses; the message names the Cockpit 1.0.2 option.

    """

    native_name: ClassVar[str] = ""
    """Name of the native quantity that computes this one."""

    legacy_options: ClassVar[dict[str, str]] = {}
    """Cockpit 1.0.2 option -> native option, to name the 1.0.2 option in error messages."""

    def __init__(self, track_schedule: Callable[[int], bool], verbose: bool = False):
        if not type(self).native_name:
            raise TypeError(
                f"{type(self).__name__} has no native quantity: cockpit_compat only "
                "mirrors Cockpit 1.0.2's 19 quantities. Write new quantities against the "
                "native protocol (docs/writing_quantities.md) and pass them to "
                "Cockpit(..., quantities=[...]) or cockpit.add(...)."
            )
        if not callable(track_schedule):
            raise TypeError(
                f"{type(self).__name__}(track_schedule=...) needs a callable global_step -> "
                f"bool, e.g. schedules.linear(1); got {track_schedule!r}."
            )
        self._track_schedule = track_schedule
        self._verbose = bool(verbose)
        self._bound: tuple[weakref.ref[OutputSource], str] | None = None

    # -- what the native engine gets --------------------------------------------------------

    def native_options(self) -> dict[str, Any]:
        """Options of the native quantity (without the schedule)."""
        return {}

    def native_schedule(self) -> Callable[[int], bool]:
        """The schedule of the native quantity."""
        return self._track_schedule

    def to_native(self, registry: Registry | None = None, label: str | None = None) -> Any:
        """A native quantity instance with the translated options.

        Args:
            registry: Where to find the native quantity (default: every installed plugin).
            label: Output key of the native instance (``None``: the native name).

        Raises:
            ValueError: The native quantity refuses an option; the message names the
                Cockpit 1.0.2 option it came from.

        """
        registry = registry if registry is not None else default_registry()
        cls = registry.get(self.native_name)
        options = self.native_options()
        if label is not None:
            options["label"] = label
        schedule = self.native_schedule()
        kwargs: dict[str, Any] = {}
        if isinstance(schedule, _SCHEDULE_MODELS):
            options["schedule"] = schedule.model_dump()
        else:
            kwargs["schedule"] = schedule
        try:
            return cls(options, **kwargs)
        except ConfigError as err:
            raise ValueError(self._explain(err)) from None

    def _explain(self, err: ConfigError) -> str:
        native_to_legacy = {v: k for k, v in self.legacy_options.items()}
        problems = []
        for path, message in err.errors:
            field = path.split(".")[1] if "." in path else path
            legacy = native_to_legacy.get(field, field)
            problems.append(f"{legacy}: {message}")
        return (
            f"{type(self).__name__}: " + "; ".join(problems) + f" (computed by the native "
            f"quantity '{self.native_name}', see `cockpit quantities`)"
        )

    def _validate(self) -> None:
        """Build the native quantity once, so that bad options fail at construction."""
        self.to_native()

    # -- what the user gets -----------------------------------------------------------------

    def to_legacy(self, value: Any, step: int) -> Any:
        """Cockpit 1.0.2's value from the native ``value`` at ``step`` (or :data:`DROP`)."""
        return value

    @classmethod
    def from_legacy(cls, value: Any) -> Any:
        """The native layout of a value read from a Cockpit 1.0.2-layout log (for plots)."""
        return value

    def should_compute(self, global_step: int) -> bool:
        """Whether the schedule selects ``global_step``."""
        return bool(self._track_schedule(global_step))

    def create_graph(self, global_step: int) -> bool:
        """Whether the quantity needs the loss graph at ``global_step`` (HVPs)."""
        return False

    def get_output(self) -> dict[int, Any]:
        """``{step: value}`` of this quantity in the Cockpit it was added to (``{}`` before)."""
        if self._bound is None:
            return {}
        ref, key = self._bound
        cockpit = ref()
        if cockpit is None:
            return {}
        return {s: v[key] for s, v in cockpit.get_output().items() if key in v}

    def bind(self, cockpit: OutputSource, key: str) -> None:
        """Remember the Cockpit and output key of this quantity (for :meth:`get_output`).

        Args:
            cockpit: The :class:`cockpit_compat.Cockpit` the quantity was added to
                (held by a weak reference).
            key: The quantity's key in that Cockpit's output.

        """
        self._bound = (weakref.ref(cockpit), key)

    @property
    def verbose(self) -> bool:
        """Whether stored values are printed."""
        return self._verbose

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.native_options().items())
        return f"{type(self).__name__}({self._track_schedule!r}{', ' if options else ''}{options})"


def is_native_quantity(obj: Any) -> bool:
    """Whether ``obj`` is an instance of the native quantity protocol."""
    return isinstance(obj, NativeQuantity)
