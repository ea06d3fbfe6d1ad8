"""Hosting a Cockpit inside training frameworks (optional extras).

- :mod:`cockpit_core.integrations.lightning`: ``CockpitCallback`` for PyTorch Lightning.
- :mod:`cockpit_core.integrations.huggingface`: ``CockpitMixin`` and ``CockpitCallback``
  for the Hugging Face Trainer (``CockpitTrainer`` is deprecated).
- :mod:`cockpit_core.integrations.reporting`: a Cockpit's scalars and findings for a
  framework's loggers.

Each framework module imports its framework only when used; see ``docs/integrations.md``.
"""
