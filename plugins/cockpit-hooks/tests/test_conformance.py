"""The provider conformance kit of the core, on the module-hook provider."""

from cockpit_hooks import HooksProvider

from cockpit_core.testing import check_provider


def test_hooks_provider_passes_the_conformance_kit():
    report = check_provider(HooksProvider)
    assert "transformer batch_l2: 16 parameter(s) match" in str(report)
    assert "not supported" not in str(report)
