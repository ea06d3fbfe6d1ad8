"""Sources of per-sample statistics. Quantities never see which backend computed a value."""

from cockpit_core.backends.backpack import BackpackBackend
from cockpit_core.backends.hooks import extend

__all__ = ["BackpackBackend", "extend"]
