"""Entry point of cockpit-diagnoses: registers its diagnoses."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterDiagnosis
from cockpit_diagnoses import DIAGNOSES

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_diagnoses(register: RegisterDiagnosis) -> None:
    """Register every rule of :data:`cockpit_diagnoses.DIAGNOSES`."""
    for diagnosis in DIAGNOSES:
        register(diagnosis)
