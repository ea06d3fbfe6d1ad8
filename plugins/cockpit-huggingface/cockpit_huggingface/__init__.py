"""Cockpit for the Hugging Face Trainer: one callback builds, feeds, reports and closes it.

::

    from cockpit_huggingface import CockpitCallback

    trainer = Trainer(..., callbacks=[CockpitCallback(quantities="economy")])

- :class:`CockpitCallback` (:mod:`cockpit_huggingface.callback`): the ``TrainerCallback``;
- :class:`CockpitMixin`: optional, the previous way to host the callback
  (``class MyTrainer(CockpitMixin, Trainer)``); ``CockpitTrainer`` is deprecated;
- :data:`LOGGER_NAME`: the logger of findings; :data:`STATE_FILE`: the Cockpit's state in
  each checkpoint folder.

Built on the core's host kit (:mod:`cockpit_core.hosts`); see ``docs/integrations.md``.
Install: ``pip install cockpit-huggingface``.
"""

from cockpit_huggingface.callback import (
    LOGGER_NAME,
    STATE_FILE,
    CockpitCallback,
    CockpitMixin,
    CockpitTrainer,
)

__all__ = ["LOGGER_NAME", "STATE_FILE", "CockpitCallback", "CockpitMixin", "CockpitTrainer"]
