"""The core-owned cross-step cache with explicit lifetimes.

Two-step quantities (e.g. ``update_size``) keep a value from a start step until an end
step; others keep a value for the whole run (e.g. ``distance`` keeps the first parameters).
Every entry has an owner (the quantity name) and an expiry step; :meth:`Cache.evict`
drops what expired, so the cache only holds what live quantities still need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FOREVER: int | None = None
"""Lifetime of an entry that stays until it is popped or its owner is removed."""


@dataclass
class _Entry:
    value: Any
    expires_after: int | None


class Cache:
    """Values kept across steps, keyed by ``(owner, key)``, each with an expiry step."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}

    def put(self, owner: str, key: str, value: Any, expires_after: int | None = FOREVER) -> None:
        """Store ``value``; it is dropped by :meth:`evict` once a step after ``expires_after`` begins."""
        self._entries[(owner, key)] = _Entry(value, expires_after)

    def get(self, owner: str, key: str, default: Any = None) -> Any:
        """Return the stored value or ``default``."""
        entry = self._entries.get((owner, key))
        return default if entry is None else entry.value

    def pop(self, owner: str, key: str, default: Any = None) -> Any:
        """Remove and return the stored value (or ``default``)."""
        entry = self._entries.pop((owner, key), None)
        return default if entry is None else entry.value

    def __contains__(self, owner_key: tuple[str, str]) -> bool:
        return owner_key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[str, str]]:
        """All ``(owner, key)`` pairs currently stored."""
        return list(self._entries)

    def evict(self, step: int) -> list[tuple[str, str]]:
        """Drop entries whose lifetime ended before ``step``; return their keys."""
        dead = [
            k
            for k, e in self._entries.items()
            if e.expires_after is not None and e.expires_after < step
        ]
        for k in dead:
            del self._entries[k]
        return dead

    def entries(self, owner: str) -> dict[str, tuple[Any, int | None]]:
        """``{key: (value, expires_after)}`` of ``owner``'s entries (what a checkpoint keeps)."""
        return {k: (e.value, e.expires_after) for (o, k), e in self._entries.items() if o == owner}

    def remove_owner(self, owner: str) -> None:
        """Drop every entry of ``owner`` (used when a quantity is disabled)."""
        for k in [k for k in self._entries if k[0] == owner]:
            del self._entries[k]

    def nbytes(self) -> int:
        """Bytes held by tensors (also inside lists/tuples/dicts) in the cache."""
        return sum(_nbytes(e.value) for e in self._entries.values())


class QuantityCache:
    """The core cache seen by one quantity: keys are private to it."""

    def __init__(self, cache: Cache, owner: str):
        self._cache, self._owner = cache, owner

    def put(self, key: str, value: Any, expires_after: int | None = FOREVER) -> None:
        """Keep ``value`` until step ``expires_after`` has passed (``None``: for the run)."""
        self._cache.put(self._owner, key, value, expires_after)

    def get(self, key: str, default: Any = None) -> Any:
        """Return a kept value or ``default``."""
        return self._cache.get(self._owner, key, default)

    def pop(self, key: str, default: Any = None) -> Any:
        """Remove and return a kept value."""
        return self._cache.pop(self._owner, key, default)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    nbytes = getattr(value, "nbytes", 0)
    return nbytes if isinstance(nbytes, int) else 0
