"""Hosting a Cockpit inside training frameworks (optional extras).

- :mod:`cockpit_core.integrations.lightning`: ``CockpitCallback`` for PyTorch Lightning.
- :mod:`cockpit_core.integrations.huggingface`: ``CockpitCallback`` for the Hugging Face
  Trainer (``CockpitMixin`` is optional, ``CockpitTrainer`` deprecated).
- :mod:`cockpit_core.integrations.reporting`: a Cockpit's scalars and findings for a
  framework's loggers.

Each framework module imports its framework only when used; see ``docs/integrations.md``.
"""
