"""Fixtures of the dashboard tests."""

import pytest

from cockpit_core import Registry


@pytest.fixture
def registry_with_basic():
    """A registry with cockpit-basic (loss, norms, ...) and the dashboard that draws them."""
    import cockpit_basic.plugin
    import cockpit_dashboard.plugin

    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic")
    registry.add_plugin(cockpit_dashboard.plugin, name="dashboard")
    return registry
