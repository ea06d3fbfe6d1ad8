"""Entry point of cockpit-demo: registers the ``cockpit demo`` command."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterCommand
from cockpit_demo.command import configure, run

COCKPIT_PROTOCOL_VERSION = 1

HELP = "train a small network with cockpit on: the digits MLP, or a nanoGPT (--model gpt)"
"""The one-line help of ``cockpit demo``."""


@hookimpl
def register_commands(register: RegisterCommand) -> None:
    """Register ``cockpit demo`` (:mod:`cockpit_demo.command`)."""
    register("demo", configure, run, help=HELP)
