"""Cockpit for PyTorch Lightning: a callback that tracks training, no model changes.

::

    from cockpit_lightning import CockpitCallback

    trainer = pl.Trainer(callbacks=[CockpitCallback(quantities="economy")])

- :class:`CockpitCallback` (:mod:`cockpit_lightning.callback`): builds, feeds, reports and
  closes a Cockpit around the Trainer's backward passes.

Built on the core's host kit (:mod:`cockpit_core.hosts`); see ``docs/integrations.md``.
Install: ``pip install cockpit-lightning``.
"""

from cockpit_lightning.callback import CockpitCallback

__all__ = ["CockpitCallback"]
