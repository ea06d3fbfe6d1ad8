"""Bounded scalar series: :class:`ReducedSeries` keeps at most ``limit`` points however long.

The web view's follower keeps one per series. The latest ``limit // 2`` values are kept
exactly (a value may still be replaced or removed there, as a resumed run re-records its
steps); older ones are reduced into buckets of ``width`` consecutive values, each holding
the count, the sum (its mean), the smallest and the largest value with their steps, and
whether it held a gap (a non-finite value). When more than ``limit // 4`` buckets exist,
neighbours merge pairwise and ``width`` doubles, so a series of any length takes at most
``limit // 2 + limit // 4`` entries, and shows at most ``limit`` points: the exact values,
and for each bucket its smallest and its largest value at their own steps (one point when
they coincide; a bucket of gaps only shows a gap at its first step). The extremes of the
whole series are always among the points shown; a gap inside a bucket that also holds
numbers is not shown.
"""

from __future__ import annotations

from typing import Any

Point = tuple[int, float | None]


class _Bucket:
    __slots__ = ("count", "finite", "first", "last", "lo", "hi", "total", "origin")

    def __init__(self, step: int, value: float | None):
        self.first = self.last = step
        self.count = 1
        self.finite = 0
        self.total = 0.0
        self.lo: Point = (step, None)
        self.hi: Point = (step, None)
        self.origin: Point | None = None  # the first finite value
        self.add(step, value, counted=False)

    def add(self, step: int, value: float | None, counted: bool = True) -> None:
        if counted:
            self.count += 1
            self.first, self.last = min(self.first, step), max(self.last, step)
        if value is None:
            return
        self.finite += 1
        self.total += value
        if self.lo[1] is None or value < self.lo[1]:
            self.lo = (step, value)
        if self.hi[1] is None or value > self.hi[1]:
            self.hi = (step, value)
        if self.origin is None or step < self.origin[0]:
            self.origin = (step, value)

    def merge(self, other: _Bucket) -> None:
        self.count += other.count
        self.finite += other.finite
        self.total += other.total
        self.first, self.last = min(self.first, other.first), max(self.last, other.last)
        if other.lo[1] is not None and (self.lo[1] is None or other.lo[1] < self.lo[1]):
            self.lo = other.lo
        if other.hi[1] is not None and (self.hi[1] is None or other.hi[1] > self.hi[1]):
            self.hi = other.hi
        if other.origin is not None and (self.origin is None or other.origin < self.origin):
            self.origin = other.origin

    @property
    def mean(self) -> float | None:
        return self.total / self.finite if self.finite else None

    def points(self) -> list[Point]:
        if not self.finite:
            return [(self.first, None)]
        return sorted({self.lo, self.hi})


class ReducedSeries:
    """One scalar series, ``{step: value}``, reduced to at most ``limit`` points shown.

    Args:
        limit: Points shown at most (at least 8); see the module.

    Attributes:
        count: Values taken (replacements not counted twice while exact).
        approximate: Values that could not be replaced or removed exactly because their
            step was already reduced into a bucket (added to it instead).

    """

    def __init__(self, limit: int = 2000):
        self.limit = max(int(limit), 8)
        self.exact: dict[int, float | None] = {}
        self.buckets: list[_Bucket] = []
        self.width = 1
        self.count = 0
        self.approximate = 0
        self._shown: tuple[bool, dict[int, float | None]] | None = None  # of points()

    @property
    def reduced_up_to(self) -> int | None:
        """The last step held in a bucket (``None``: every value is exact)."""
        return self.buckets[-1].last if self.buckets else None

    def __len__(self) -> int:
        return len(self.exact) + sum(len(b.points()) for b in self.buckets)

    def set(self, step: int, value: float | None) -> None:
        """Take the value of ``step`` (replacing the one there while it is exact)."""
        self._shown = None
        floor = self.reduced_up_to
        if floor is not None and step <= floor:
            self.approximate += 1
            self.count += 1
            for bucket in self.buckets:
                if step <= bucket.last:
                    bucket.add(step, value)
                    return
        if step not in self.exact:
            self.count += 1
        self.exact[step] = value
        if len(self.exact) > self.limit // 2:
            self._reduce()

    def remove(self, step: int) -> None:
        """Drop the value of ``step`` if it is still exact (else count it approximate)."""
        self._shown = None
        if self.exact.pop(step, _MISSING) is not _MISSING:
            self.count -= 1
        elif self.reduced_up_to is not None and step <= self.reduced_up_to:
            self.approximate += 1

    def _reduce(self) -> None:
        """Move the oldest half of the exact values into buckets; merge buckets if too many."""
        steps = sorted(self.exact)
        for step in steps[: len(steps) // 2]:
            value = self.exact.pop(step)
            last = self.buckets[-1] if self.buckets else None
            if last is not None and last.count < self.width:
                last.add(step, value)
            else:
                self.buckets.append(_Bucket(step, value))
        while len(self.buckets) > self.limit // 4:
            merged = []
            for i in range(0, len(self.buckets), 2):
                bucket = self.buckets[i]
                if i + 1 < len(self.buckets):
                    bucket.merge(self.buckets[i + 1])
                merged.append(bucket)
            self.buckets = merged
            self.width *= 2

    def origin(self) -> float | None:
        """The value at the first step with a finite value (what ``time`` counts from)."""
        for bucket in self.buckets:
            if bucket.origin is not None:
                return bucket.origin[1]
        found = [(s, v) for s, v in self.exact.items() if v is not None]
        return min(found)[1] if found else None

    def points(self, shift: bool = False) -> dict[int, float | None]:
        """``{step: value}`` of the points shown, by step (``shift``: minus :meth:`origin`).

        Made once after each change (the same dict until the next: do not modify it).
        """
        if self._shown is not None and self._shown[0] == shift:
            return self._shown[1]
        out: dict[int, float | None] = {}
        for bucket in self.buckets:
            out.update(bucket.points())
        out.update(sorted(self.exact.items()))
        if shift:
            origin = self.origin()
            if origin is not None:
                out = {s: None if v is None else v - origin for s, v in out.items()}
        self._shown = (shift, out)
        return out


_MISSING: Any = object()
