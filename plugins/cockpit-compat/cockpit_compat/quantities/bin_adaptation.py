"""Cockpit 1.0.2's bin adaptation policies of the gradient histograms.

They translate into the native histograms' ``adapt`` option (``{"kind": "grad_abs_max" |
"param_abs_max", "padding", "min_size"}``): after each tracked step the range becomes
``[-m, m]`` with ``m = (1 + padding) * max(min_size / 2, max |value|)``. Cockpit 1.0.2
gave the policy a schedule of its own; the native histograms adapt on the histogram's
schedule, so a policy must be given the same schedule as its histogram.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


class BinAdaptation:
    """Base class of the policies that move a histogram's bin range."""

    kind: ClassVar[str | None] = None

    def __init__(self, track_schedule: Callable[[int], bool] | None, verbose: bool = False):
        self._track_schedule = track_schedule
        self._verbose = bool(verbose)

    def native(
        self, histogram_schedule: Callable[[int], bool], where: str
    ) -> dict[str, Any] | None:
        """The native ``adapt`` entry, or ``None`` for no adaptation.

        Args:
            histogram_schedule: The schedule of the histogram this policy belongs to.
            where: Names the histogram and option in error messages.

        Raises:
            ValueError: The policy has a schedule different from the histogram's.

        """
        raise NotImplementedError  # pragma: no cover - every public policy overrides it


class NoAdaptation(BinAdaptation):
    """Leave the bin range as it is."""

    def __init__(self, verbose: bool = False):
        super().__init__(None, verbose=verbose)

    def native(self, histogram_schedule: Callable[[int], bool], where: str) -> None:
        """``None``: a fixed range."""
        return None


class _AbsMax(BinAdaptation):
    def __init__(
        self,
        track_schedule: Callable[[int], bool],
        verbose: bool = False,
        padding: float = 0.0,
        min_size: float = 1e-6,
    ):
        super().__init__(track_schedule, verbose=verbose)
        self._padding = padding
        self._min_size = min_size

    def native(self, histogram_schedule: Callable[[int], bool], where: str) -> dict[str, Any]:
        """``{"kind", "padding", "min_size"}`` of the native range adaptation."""
        same = self._track_schedule is histogram_schedule
        if not same:
            try:
                same = bool(self._track_schedule == histogram_schedule)
            except Exception:  # noqa: BLE001 - an exotic __eq__ means "not known to be equal"
                same = False
        if not same:
            raise ValueError(
                f"{where}: {type(self).__name__} has a track_schedule different from its "
                "histogram's. The native histograms adapt their range after each step they "
                "track, on their own schedule; give the policy the histogram's schedule "
                "(the same object, or an equal schedules.linear/logarithmic)."
            )
        return {"kind": self.kind, "padding": self._padding, "min_size": self._min_size}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._track_schedule!r}, padding={self._padding!r}, "
            f"min_size={self._min_size!r})"
        )


class GradAbsMax(_AbsMax):
    """Range ``[-m, m]`` from the largest absolute per-sample gradient element ``m``.

    Args:
        track_schedule: Must be the histogram's schedule (see the module docstring).
        verbose: Accepted for compatibility; the native histograms report nothing extra.
        padding: Relative padding added to ``m``.
        min_size: Smallest width of the range.

    """

    kind = "grad_abs_max"


class ParamAbsMax(_AbsMax):
    """Range ``[-m, m]`` from the largest absolute parameter element ``m``.

    Args:
        track_schedule: Must be the histogram's schedule (see the module docstring).
        verbose: Accepted for compatibility; the native histograms report nothing extra.
        padding: Relative padding added to ``m``.
        min_size: Smallest width of the range.

    """

    kind = "param_abs_max"


def native_adapt(adapt: Any, histogram_schedule: Callable[[int], bool], where: str) -> Any:
    """Translate one ``adapt`` argument of a compat histogram into the native option.

    Raises:
        ValueError: ``adapt`` is neither ``None`` nor one of this module's policies, or
            its schedule differs from the histogram's.

    """
    if adapt is None:
        return None
    if isinstance(adapt, BinAdaptation) and (adapt.kind is not None or type(adapt) is NoAdaptation):
        return adapt.native(histogram_schedule, where)
    raise ValueError(
        f"{where}: {adapt!r} is not a policy the native histograms know. Use None, "
        "NoAdaptation(), GradAbsMax(schedule, padding=..., min_size=...) or "
        "ParamAbsMax(schedule, ...) from cockpit_compat.quantities.bin_adaptation."
    )


__all__ = ["BinAdaptation", "GradAbsMax", "NoAdaptation", "ParamAbsMax"]
