"""Cockpit 1.0.2's ``cockpit.utils``: :mod:`.configuration` and :mod:`.schedules`."""

from cockpit_compat.utils import configuration, schedules

__all__ = ["configuration", "schedules"]
