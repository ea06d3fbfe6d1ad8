"""Hosting a Cockpit inside training frameworks (optional extras).

- :mod:`cockpit_core.integrations.lightning`: ``CockpitCallback`` for PyTorch Lightning.
- :mod:`cockpit_core.integrations.huggingface`: ``CockpitTrainer`` for the Hugging Face Trainer.

Each module imports its framework only when used; see ``docs/integrations.md``.
"""
