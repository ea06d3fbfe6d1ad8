"""Cockpit 1.0.2's API on the native engine: change ``cockpit`` to ``cockpit_core.compat``.

A script written for Cockpit 1.0.2 (PyPI ``cockpit-for-pytorch``) runs unchanged once its
imports read::

    from cockpit_core.compat import Cockpit, CockpitPlotter, quantities
    from cockpit_core.compat.utils import schedules
    from cockpit_core.compat.utils.configuration import configuration

The modules mirror Cockpit 1.0.2's public paths (``cockpit.quantities``,
``cockpit.quantities.bin_adaptation``, ``cockpit.utils.configuration``,
``cockpit.utils.schedules``, ``cockpit.cockpit``, ``cockpit.plotter``). Nothing is
computed here: each quantity class translates its options onto a native quantity, and
:class:`Cockpit` translates the native output back into Cockpit 1.0.2's layout
(``{step: {ClassName: value}}``). ``docs/migrating.md`` lists every mapping and the
differences in values.
"""

from cockpit_core.compat import quantities, utils
from cockpit_core.compat.cockpit import Cockpit
from cockpit_core.compat.plotter import CockpitPlotter
from cockpit_core.plugins import core_version

__version__ = core_version()

__all__ = ["Cockpit", "CockpitPlotter", "__version__", "quantities", "utils"]
