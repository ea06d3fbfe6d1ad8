"""Cockpit 1.0.2's API on the native engine: change ``cockpit`` to ``cockpit_compat``.

The distribution ``cockpit-compat`` (``pip install cockpit-compat``). A script written for
Cockpit 1.0.2 (PyPI ``cockpit-for-pytorch``) runs unchanged once its imports read::

    from cockpit_compat import Cockpit, CockpitPlotter, quantities
    from cockpit_compat.utils import schedules
    from cockpit_compat.utils.configuration import configuration

The modules mirror Cockpit 1.0.2's public paths (``cockpit.quantities``,
``cockpit.quantities.bin_adaptation``, ``cockpit.utils.configuration``,
``cockpit.utils.schedules``, ``cockpit.cockpit``, ``cockpit.plotter``). Nothing is
computed here: each quantity class translates its options onto a native quantity, and
:class:`Cockpit` translates the native output back into Cockpit 1.0.2's layout
(``{step: {ClassName: value}}``). ``docs/migrating.md`` lists every mapping and the
differences in values. The package uses only ``cockpit_core``'s public modules; the core
never imports it.
"""

from cockpit_compat import quantities, utils
from cockpit_compat.cockpit import Cockpit
from cockpit_compat.plotter import CockpitPlotter
from cockpit_core.plugin.discovery import installed_version

__version__ = installed_version("cockpit-compat")

__all__ = ["Cockpit", "CockpitPlotter", "__version__", "quantities", "utils"]
