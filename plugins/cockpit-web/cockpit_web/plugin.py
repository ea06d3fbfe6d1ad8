"""Entry point of cockpit-web: the ``.html`` renderer and the ``cockpit serve`` command."""

from __future__ import annotations

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterCommand, RegisterRenderer
from cockpit_web import command
from cockpit_web.render import render_html

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_renderers(register: RegisterRenderer) -> None:
    """Register ``.html``: the web view as one self-contained page (``cockpit plot -o x.html``)."""
    register(
        ".html",
        render_html,
        description="the web view: plotly charts of the runs in one self-contained page",
    )


@hookimpl
def register_commands(register: RegisterCommand) -> None:
    """Register ``cockpit serve``: the web view in a browser, updated while runs train."""
    register("serve", command.configure, command.run, help=command.HELP)
