"""Exceptions raised by cockpit. Every message says what went wrong and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def _control(char: str) -> bool:
    """Whether ``char`` is a terminal control character (C0, DEL, C1) or otherwise unprintable."""
    return not char.isprintable()


def shown_name(name: object) -> str:
    r"""``name`` quoted for a message, terminal control characters escaped (repr-style).

    A printable name is shown as ``'name'``; one with a control character (an escape
    sequence such as ``"\x1b[31m"``, a newline) or of another type as its ``repr``, so a
    user-supplied name can never reach a terminal raw.
    """
    if isinstance(name, str) and not any(_control(c) for c in name) and "'" not in name:
        return f"'{name}'"
    return repr(name)


def escape_controls(text: str, keep: str = "\n") -> str:
    r"""``text`` with every unprintable character except those of ``keep`` escaped (``\x1b``)."""
    if all(c in keep or not _control(c) for c in text):
        return text
    return "".join(c if c in keep or not _control(c) else repr(c)[1:-1] for c in text)


class CockpitError(Exception):
    """Base class of every error cockpit raises on purpose."""


class ConfigError(CockpitError, ValueError):
    """A configuration (file, dict or keyword arguments) is invalid.

    Attributes:
        errors: One ``(field_path, message)`` pair per problem, e.g.
            ``("quantities.2.bins", "Input should be greater than 0")``.

    """

    def __init__(self, errors: list[tuple[str, str]], source: str | None = None):
        self.errors = errors
        where = f" in {source}" if source else ""
        lines = [f"Invalid cockpit configuration{where}:"]
        lines += [
            f"  {escape_controls(path, keep='') or '<root>'}: {escape_controls(msg)}"
            for path, msg in errors
        ]
        super().__init__("\n".join(lines))


class UnknownNameError(CockpitError, KeyError):
    """A name (of a quantity, preset or sink) that no installed plugin registers.

    The message names the closest installed name and lists them all.
    """

    kind = "name"
    listing_hint = "Run `cockpit plugins -v` to list what the installed plugins register."

    def __init__(self, name: str, installed: Iterable[str]):
        self.name = name
        installed = sorted(installed)
        close = difflib.get_close_matches(name, installed, n=1) if isinstance(name, str) else []
        hint = f" Did you mean {shown_name(close[0])}?" if close else ""
        listing = (
            escape_controls(", ".join(installed), keep="")
            if installed
            else "(none: install a cockpit plugin)"
        )
        self.message = (
            f"Unknown {self.kind} {shown_name(name)}.{hint} Installed: {listing}. "
            f"{self.listing_hint}"
        )
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message


class UnknownQuantityError(UnknownNameError):
    """A quantity name is not provided by any installed plugin."""

    kind = "quantity"
    listing_hint = "Run `cockpit quantities` to list them with their options."


class UnknownPresetError(UnknownNameError):
    """A preset name is not provided by any installed plugin."""

    kind = "preset"
    listing_hint = "Run `cockpit quantities` to list them with their options."


class UnknownSinkError(UnknownNameError):
    """A sink name is not provided by any installed plugin."""

    kind = "sink"
    listing_hint = "Run `cockpit plugins` to list the installed sinks."


class UnknownInstrumentError(UnknownNameError):
    """A dashboard panel (instrument) name is not registered by any installed plugin."""

    kind = "panel"
    listing_hint = "Run `cockpit plugins -v` to list the panels of each plugin."


class UnknownRendererError(UnknownNameError):
    """No installed plugin renders files of a suffix (``.png``, ``.html``, ...)."""

    kind = "file type"
    listing_hint = (
        "Install a plugin that renders it (cockpit-dashboard: .png, .svg, .pdf; cockpit-web: "
        ".html); `cockpit plugins -v` lists the renderers of each plugin."
    )


class DuplicateNameError(CockpitError):
    """Two installed distributions register the same name (quantity, preset, sink, ...)."""


DuplicateQuantityError = DuplicateNameError
"""The earlier name of :class:`DuplicateNameError` (kept for existing ``except`` clauses)."""


class RequirementConflictError(CockpitError):
    """Two quantities request the same statistic with different hyperparameters."""


class MissingInfoError(CockpitError, KeyError):
    """The ``info`` dict passed to ``cockpit(step, info=...)`` lacks a key a quantity needs."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return self.message


class UnsupportedModelError(CockpitError):
    """A statistic could not be computed for some parameters of the model."""


class MisuseError(CockpitError):
    """The Cockpit object was used in a way that cannot give correct results."""


class LogLockedError(MisuseError):
    """Another writer (a Cockpit in this or another process) is writing the same log.

    A log has one writer at a time (see ``docs/log_format.md``); the message names the log,
    the PID of the process that writes it and what to do: another log path, or close the
    other Cockpit or wait for that process to end.
    """


class StateError(CockpitError, ValueError):
    """A saved Cockpit state (``cp.load_state_dict``) does not fit this Cockpit.

    The message names what differs (a quantity not tracked now, other options, another
    version of the state's layout) and how to load it anyway (``strict=False``).
    """


class CockpitWarning(UserWarning):
    """Something went wrong that does not stop training (a quantity failed, a step was skipped)."""
