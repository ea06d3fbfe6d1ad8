"""pytest plugin (entry point ``pytest11``) with fixtures for testing cockpit quantities."""

from __future__ import annotations

import pytest


@pytest.fixture
def cockpit_tiny_mlp():
    """A fresh :func:`cockpit_core.testing.tiny_mlp` problem."""
    from cockpit_core.testing.problems import tiny_mlp

    return tiny_mlp()


@pytest.fixture
def cockpit_tiny_cnn():
    """A fresh :func:`cockpit_core.testing.tiny_cnn` problem."""
    from cockpit_core.testing.problems import tiny_cnn

    return tiny_cnn()
