"""The kit for writing a training-framework integration: hosting a Cockpit in a framework.

A framework integration (a "host": a Lightning callback, a Hugging Face ``TrainerCallback``,
your own) builds a Cockpit from a model and its optimizers, runs the framework's backward
passes inside Cockpit steps and hands the values to the framework's loggers. The pieces
every host needs, and the two first-party hosts use:

- :mod:`cockpit_core.hosts.parameters`: which parameters the optimizers update, which a
  backward pass reaches, the batch size of a batch;
- :mod:`cockpit_core.hosts.per_sample`: per-sample losses (``info["individual_losses"]``)
  from the model's outputs and the targets, checked against the framework's own loss;
- :mod:`cockpit_core.hosts.reporting`: a Cockpit's scalars and findings for a framework's
  loggers (the dashboard as an image is cockpit-dashboard's ``dashboard_image``).

None of them imports a framework. The hosts themselves are distributions of their own:
``cockpit-lightning`` (``from cockpit_lightning import CockpitCallback``) and
``cockpit-huggingface`` (``from cockpit_huggingface import CockpitCallback``); see
``docs/integrations.md``.
"""
