"""Sources of per-sample statistics. Quantities never see which backend computed a value."""

from cockpit_core.backends.backpack import BackpackBackend, extend

__all__ = ["BackpackBackend", "extend"]
