"""pytest plugin (entry point ``pytest11``) with fixtures for testing cockpit quantities."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from cockpit_core.testing.problems import Problem


@pytest.fixture
def cockpit_tiny_mlp() -> Problem:
    """A fresh :func:`cockpit_core.testing.tiny_mlp` problem."""
    from cockpit_core.testing.problems import tiny_mlp

    return tiny_mlp()


@pytest.fixture
def cockpit_tiny_cnn() -> Problem:
    """A fresh :func:`cockpit_core.testing.tiny_cnn` problem."""
    from cockpit_core.testing.problems import tiny_cnn

    return tiny_cnn()
