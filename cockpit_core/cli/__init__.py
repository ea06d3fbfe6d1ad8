"""The ``cockpit`` command line.

:mod:`~cockpit_core.cli.main` holds the parser and the exit codes,
:mod:`~cockpit_core.cli.commands` one function per core command.
"""

CORE_COMMANDS = frozenset(
    {"plugins", "quantities", "schema", "validate", "check", "plot", "diagnose", "new-plugin"}
)
"""The core's own ``cockpit`` sub-commands: names ``register_commands`` cannot take."""
