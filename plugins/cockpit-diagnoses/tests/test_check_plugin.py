"""Every rule of cockpit-diagnoses passes check_plugin's checks of diagnoses."""

from cockpit_diagnoses import DIAGNOSES

from cockpit_core.testing import check_plugin


def test_check_plugin_passes_every_rule():
    report = check_plugin("diagnoses")
    assert report.checked == [f"diagnosis {cls.name}" for cls in DIAGNOSES]
