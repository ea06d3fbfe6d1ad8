"""cockpit-alpha: the normalized local step size alpha (Mahsereci & Hennig, 2017)."""

from cockpit_alpha.alpha import Alpha

__all__ = ["Alpha"]
