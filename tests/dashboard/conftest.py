"""Fixtures of the dashboard tests."""

import pytest

from cockpit_core import Registry


@pytest.fixture
def registry_with_basic():
    """A registry with cockpit-basic (loss, norms, ...) and nothing else."""
    import cockpit_basic.plugin

    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic")
    return registry
