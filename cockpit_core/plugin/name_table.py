"""Names that plugins register, and what happens when two distributions pick the same one.

Every table of the :class:`~cockpit_core.Registry` (quantities and presets, statistics
providers, statistic kinds, dashboard instruments, sinks) is a :class:`NameTable` with one
rule: the first distribution to register a name keeps it, later ones are recorded as a
clash (``cockpit plugins`` reports it). A table is *strict* when a user asks for entries by
name (quantities, presets, sinks): using a clashing name then raises
:class:`~cockpit_core.errors.DuplicateNameError`, since cockpit cannot tell which one
is meant. Tables the core walks itself (providers, kinds, instruments) keep the first.
"""

from __future__ import annotations

import re
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from typing import Any, Generic, TypeVar

from cockpit_core.errors import DuplicateNameError

T = TypeVar("T")


class NameTable(Generic[T]):
    """Entries by name, each with the distribution that registered it.

    Args:
        label: How messages call a name of this table, e.g. ``"sink name"``.
        noun: What an entry is, e.g. ``"sink"`` (in "ask one author to rename the sink").
        strict: Whether looking up a clashing name raises (see the module docstring).

    """

    def __init__(self, label: str, noun: str, strict: bool):
        self.label = label
        self.noun = noun
        self.strict = strict
        self._entries: dict[str, T] = {}
        self._claimants: dict[str, list[str]] = {}  # name -> distributions, first = owner

    def add(self, name: str, entry: T, distribution: str) -> bool:
        """Register ``entry`` as ``name``; return ``False`` (and record a clash) if taken."""
        claimants = self._claimants.setdefault(name, [])
        claimants.append(distribution)
        if len(claimants) > 1:
            return False
        self._entries[name] = entry
        return True

    def clash(self, name: str) -> DuplicateNameError | None:
        """The error that describes a clash on ``name``, or ``None``."""
        claimants = self._claimants.get(name, [])
        if len(claimants) < 2:
            return None
        who = _listing(claimants)
        if self.strict:
            return DuplicateNameError(
                f"The {self.label} '{name}' is registered by {who}, so cockpit cannot tell "
                "which one you mean. Uninstall one of the distributions (pip uninstall ...), "
                f"or ask one author to rename the {self.noun}."
            )
        return DuplicateNameError(
            f"The {self.label} '{name}' is registered by {who}; the one of '{claimants[0]}' "
            "is used. Uninstall one of the distributions (pip uninstall ...), or ask one "
            f"author to rename the {self.noun}."
        )

    def clashes(self) -> dict[str, DuplicateNameError]:
        """Every clash, by name."""
        found = {name: self.clash(name) for name in self._claimants}
        return {name: err for name, err in found.items() if err is not None}

    def lookup(self, name: str) -> T | None:
        """The entry of ``name`` (``None`` if unknown); a strict table raises on a clash.

        Raises:
            DuplicateNameError: Strict table, several distributions register ``name``.

        """
        if self.strict:
            err = self.clash(name)
            if err is not None:
                raise err
        return self._entries.get(name)

    def owner(self, name: str) -> str | None:
        """The distribution whose entry ``name`` is."""
        claimants = self._claimants.get(name)
        return claimants[0] if claimants else None

    # -- read-only mapping of the entries in use --------------------------------------------

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __setitem__(self, name: str, entry: T) -> None:
        """Put ``entry`` in place of whatever ``name`` is (the testing kit swaps providers)."""
        self._entries[name] = entry
        self._claimants.setdefault(name, ["<direct>"])

    def __delitem__(self, name: str) -> None:
        """Forget ``name`` (tests: "as if that plugin were not installed")."""
        del self._entries[name]
        self._claimants.pop(name, None)

    def pop(self, name: str, default: T | None = None) -> T | None:
        """Forget ``name`` and return its entry (or ``default``)."""
        if name not in self._entries:
            return default
        entry = self._entries[name]
        del self[name]
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NameTable):
            return self._entries == dict(other.items())
        return self._entries == other

    __hash__ = None  # type: ignore[assignment]  # mutable, so unhashable

    def get(self, name: str, default: T | None = None) -> T | None:
        """The entry of ``name`` or ``default`` (no clash check)."""
        return self._entries.get(name, default)

    def keys(self) -> KeysView[str]:
        """Names in registration order."""
        return self._entries.keys()

    def values(self) -> ValuesView[T]:
        """Entries in registration order."""
        return self._entries.values()

    def items(self) -> ItemsView[str, T]:
        """``(name, entry)`` in registration order."""
        return self._entries.items()


def _listing(distributions: list[str]) -> str:
    """``both 'a' and 'b'``, ``'a', 'b' and 'c'`` or ``'a' more than once``."""
    unique = sorted(set(distributions))  # sorted: the message does not depend on load order
    if len(unique) == 1:
        return f"'{unique[0]}' more than once"
    quoted = [f"'{d}'" for d in unique]
    listing = ", ".join(quoted[:-1]) + f" and {quoted[-1]}"
    return f"both {listing}" if len(unique) == 2 else listing


def check_named_class(
    cls: Any,
    base: type,
    public_path: str,
    what: str,
    pattern: re.Pattern[str],
    example: str,
    rule: str = "snake_case",
) -> None:
    """Raise ``TypeError`` with a fix unless ``cls`` subclasses ``base`` and has a valid name.

    The part every ``register(...)`` hook of a class shares (quantities, providers,
    diagnoses); each adds its own checks after it.

    Args:
        cls: The registered object.
        base: The class it must subclass.
        public_path: ``base`` as users import it (``"cockpit_core.Quantity"``), for the message.
        what: What is registered (``"quantity"``), for the message.
        pattern: What ``cls.name`` must match.
        example: A valid name (``"grad_norm"``).
        rule: The naming rule, in words.

    """
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{cls!r} is not a subclass of {public_path}.")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not pattern.match(name):
        raise TypeError(
            f"{cls.__name__}.name = {name!r} is not a valid {what} name: use {rule}, "
            f"e.g. {example!r}."
        )
