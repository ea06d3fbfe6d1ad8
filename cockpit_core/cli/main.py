"""The ``cockpit`` command line.

Sub-commands::

    cockpit plugins [-v] [--json] [--refresh]
                                    installed plugins, what they register, load errors
    cockpit quantities [--json]     installed quantities with their options
    cockpit schema                  JSON schema of config files (for editor autocomplete)
    cockpit validate CONFIG         check a config file (exit code 0 valid, 1 invalid)
    cockpit check MODULE:FUNCTION   which quantities can be computed for a model, and how
    cockpit plot LOG... [-o OUT]    render the dashboard of a log by the renderer of OUT's
                                    suffix, or of several logs compared, a colour per run
    cockpit diagnose LOG... [--json] [--only NAME,...] [--config FILE] [--set NAME.OPTION=V]
                                    findings of the diagnoses (exit 1 if any warns)
    cockpit new-plugin NAME [...]   generate a plugin distribution (cockpit_core.cli.scaffold)
    cockpit --version               the installed cockpit-core version

Plugins add commands through the ``register_commands`` hook (cockpit-demo: ``cockpit demo``,
cockpit-web: ``cockpit serve``); they are added to the parser only when the command line
names one, so the core's commands and ``--help`` load no plugin.

This module holds the parser, :func:`main` and the exit codes; each core command is a
``cmd_*`` function of :mod:`cockpit_core.cli.commands`. Start-up: both modules import only
the standard library and :mod:`cockpit_core.errors` at module level; each sub-command
imports what it needs inside its function, so ``--help`` and ``--version`` load neither
torch nor the plugins (the package ``__init__`` aside).
``benchmarks/cli_startup.py`` measures it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cockpit_core.cli import CORE_COMMANDS
from cockpit_core.errors import CockpitError, escape_controls

if TYPE_CHECKING:
    from cockpit_core.plugin.entries import CommandEntry

BROKEN_PIPE_EXIT = 141
"""Exit code when standard output is closed early (``cockpit quantities | head -1``):
128 + SIGPIPE, what a shell reports for a process that a closed pipe ends."""


def installed_version() -> str:
    """The version of the installed ``cockpit-core`` distribution (``0+unknown`` if none)."""
    from importlib import metadata

    try:
        return metadata.version("cockpit-core")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


class _VersionAction(argparse.Action):
    """``--version``: like argparse's, but reads the version only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"cockpit {installed_version()}")
        parser.exit()


def positive_int(text: str) -> int:
    """``type`` of a count that must be at least 1 (``--rows``, ``--dpi``; plugin commands').

    Raises:
        argparse.ArgumentTypeError: ``text`` is no whole number, or one below 1.

    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _shape(text: str) -> tuple[int, ...]:
    """``type`` of ``cockpit check --input-shape``: sizes such as ``3,32,32``."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected sizes of at least 1 separated by commas, e.g. 3,32,32, got {text!r}"
        )
    return sizes


def _model_spec(text: str) -> str:
    """``type`` of ``cockpit check``'s model: ``module:function`` or ``file.py:function``."""
    module, _, function = text.rpartition(":")
    if not module or not function:
        raise argparse.ArgumentTypeError(
            f"expected 'module:function' or 'path/to/file.py:function', got {text!r}"
        )
    return text


def build_parser(plugin_commands: Iterable[CommandEntry] = ()) -> argparse.ArgumentParser:
    """The argument parser of the ``cockpit`` command; each command's ``func`` runs it.

    Args:
        plugin_commands: Commands of plugins (``register_commands``) to add after the core's.
            One whose ``configure`` raises is left out with a warning on standard error.

    """
    from cockpit_core.cli import commands  # light: the commands import lazily

    parser = argparse.ArgumentParser(
        prog="cockpit",
        description="A visual and statistical debugger for PyTorch training.",
        epilog="Run `cockpit COMMAND --help` for what a command does and its options. "
        "Installed plugins may add commands (such as demo and serve): `cockpit plugins` "
        "lists them.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the cockpit-core version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "plugins",
        help="list installed plugins and load errors",
        description="List the installed cockpit plugins (distributions with a `cockpit` entry "
        "point), each with its version, its state (ok, or SKIPPED with the reason) and what it "
        "registers, then name conflicts between plugins. Listing needs to load the plugins "
        "(and torch); the listing is cached in ~/.cache/cockpit and reused while no installed "
        "distribution, entry point, plugin file or COCKPIT_PLUGINS_DIR changed.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list each plugin's hooks, instruments and statistic kinds",
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="import the plugins even if the cached listing is still valid, and rewrite it "
        "(COCKPIT_NO_CACHE=1: no cache at all)",
    )
    p.set_defaults(func=commands.cmd_plugins)

    p = sub.add_parser(
        "quantities",
        help="list installed quantities and their options",
        description="List every installed quantity with its distribution, a one-line summary "
        "and its options (name, default, type, description), then the presets and their "
        "members.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=commands.cmd_quantities)

    p = sub.add_parser(
        "schema",
        help="print the JSON schema of config files",
        description="Print the JSON schema of cockpit config files, built from the installed "
        "quantities and sinks; point an editor at it for completion and checks "
        "(cockpit schema > cockpit.schema.json).",
    )
    p.set_defaults(func=commands.cmd_schema)

    p = sub.add_parser(
        "check",
        help="list which quantities can be computed for a model (exit 1 if any cannot)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Build the model that FUNCTION returns and report, for each quantity, whether it
can be computed and which statistics provider serves each parameter. With a
batch, also run one tracked step on a copy of the model and report what each
quantity and provider did there. MODULE is a module importable from the
current directory or a path to a .py file. Exit code 0 if every quantity can
be computed (and was, at the step), 1 if not.""",
        epilog="""\
FUNCTION returns one of:
  model              no forward pass: the providers' verdicts only
  (model, batch)     batch: the inputs (a tensor, or a dict of keyword
                     arguments), or (inputs, targets); --loss names its loss
                     (random targets when the batch has none)
  (model, sample)    sample(model) runs the model and returns the mean loss,
                     or the per-sample losses [B]

examples:
  cockpit check models.py:make_model --loss cross_entropy
  cockpit check models.py:cnn --input-shape 3,32,32 --loss cross_entropy
  cockpit check models.py:gpt --vocab 50257 --seq-len 64 --loss cross_entropy""",
    )
    p.add_argument(
        "model",
        type=_model_spec,
        metavar="MODULE:FUNCTION",
        help="'module:function' or 'path/to/file.py:function' returning the model, "
        "(model, batch) or (model, sample)",
    )
    p.add_argument("--quantities", default="economy", help="preset or comma-separated names")
    p.add_argument("--config", default=None, help="config file naming the quantities instead")
    p.add_argument(
        "--backend",
        default=None,
        help="statistics providers: 'auto' (the default: the cheapest that can serve each "
        "parameter), a provider name, or a comma-separated list in order of preference",
    )
    p.add_argument(
        "--loss",
        choices=sorted(commands.CHECK_LOSSES),
        default=None,
        help="the training loss: the loss of the batch (per sample; cross_entropy reads "
        "class scores on the last dimension), and it lets torch.func serve parameters no "
        "cheaper provider can (e.g. a learned positional embedding owned by the model itself)",
    )
    batch = p.add_argument_group(
        "random batch", "instead of a batch from FUNCTION (needs --loss; targets are random)"
    )
    batch.add_argument(
        "--input-shape",
        type=_shape,
        default=None,
        metavar="D,...",
        help="float inputs of this shape per sample, e.g. 3,32,32 (normal noise)",
    )
    batch.add_argument(
        "--vocab", type=positive_int, default=None, metavar="V", help="token ids below V"
    )
    batch.add_argument(
        "--seq-len", type=positive_int, default=None, metavar="T", help="tokens per sequence"
    )
    batch.add_argument(
        "--batch", type=positive_int, default=4, metavar="B", help="samples (default 4)"
    )
    p.set_defaults(func=commands.cmd_check)

    p = sub.add_parser(
        "validate",
        help="check a config file (exit 0 if valid, 1 if not)",
        description="Check a config file without training: the checks of "
        "Cockpit.from_config (quantity names, options, sinks), every problem with its field "
        "path. Exit code 0 if the file is valid, 1 if not.",
    )
    p.add_argument("config", help="path of a .toml, .yaml/.yml or .json config file")
    p.set_defaults(func=commands.cmd_validate)

    p = sub.add_parser(
        "plot",
        help="render the dashboard of a log (.jsonl or .json)",
        description="Render the dashboard of a log written by a Cockpit (log=... writes "
        ".jsonl, cp.write(...) .json) into a file; the installed renderer of the output's "
        "suffix draws it (cockpit-dashboard: .png, .svg, .pdf; cockpit-web: .html). Given "
        "several logs, one dashboard compares the runs: a colour per run, legends naming them.",
    )
    p.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        help="a log written with log=... (.jsonl) or cp.write(...) (.json); several to compare",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="file to write, drawn by the renderer of its suffix (`cockpit plugins -v` lists "
        "them; default: dashboard.png next to the log)",
    )
    p.add_argument("--title", default=None, help="figure title (default: a run summary)")
    p.add_argument("--rows", type=positive_int, default=4, help="panels per column (default 4)")
    p.add_argument("--dpi", type=positive_int, default=100, help="resolution of .png output")
    p.add_argument(
        "--labels",
        default=None,
        metavar="A,B,...",
        help="legend labels of compared runs, one per log (default: each run's learning "
        "rate, else its path)",
    )
    p.add_argument(
        "--diagnose",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show what the installed diagnoses find in the log (default); with "
        "--no-diagnose only the findings recorded while training",
    )
    p.set_defaults(func=commands.cmd_plot)

    p = sub.add_parser(
        "diagnose",
        help="report what the diagnoses find in logs (exit 1 on a warning or error)",
        description="Run the installed diagnoses (e.g. of cockpit-diagnoses) over each log "
        "and print their findings with evidence, suggestion and source; findings recorded "
        "while training are included. Which diagnoses run: those of --config, narrowed by "
        "--only, else those of --only, else all installed; --set then sets options of "
        "diagnoses among them. Exit code 0 if no finding is of severity warning or above, 1 "
        "if one is, 2 if a log cannot be read, a name is unknown or an option is invalid.",
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="logs (.jsonl or .json)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--only", default=None, metavar="NAME,...", help="comma-separated diagnoses to run"
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="run the 'diagnoses' of a cockpit config file (.toml, .yaml, .json), options included",
    )
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME.OPTION=VALUE",
        help="an option of a diagnosis that runs, e.g. cost.severity=warning (VALUE is JSON "
        "if it parses, else a string; repeatable)",
    )
    p.set_defaults(func=commands.cmd_diagnose)

    p = sub.add_parser(
        "new-plugin",
        help="generate a plugin distribution with a quantity and its tests",
        description="Generate the distribution cockpit-NAME in a new folder: pyproject.toml "
        "with the entry point, the plugin's hooks, a quantity with its options, tests that use "
        "the conformance kit, and a README; optionally a dashboard panel and a statistics "
        "provider.",
    )
    p.add_argument("name", help="plugin name, e.g. grad_stats (makes cockpit-grad-stats)")
    p.add_argument("--dir", default=".", help="where to create its folder (default: here)")
    p.add_argument(
        "--with-instrument", action="store_true", help="add a dashboard panel for the quantity"
    )
    p.add_argument(
        "--with-provider", action="store_true", help="add a statistics provider (a sample loop)"
    )
    p.set_defaults(func=commands.cmd_new_plugin)
    for entry in plugin_commands:
        _add_plugin_command(sub, entry)
    for command in sub.choices.values():  # a command's own check of its arguments: exit 2
        command.set_defaults(usage_error=command.error)
    return parser


def _add_plugin_command(sub: Any, entry: CommandEntry) -> None:
    """Add ``cockpit NAME`` of a plugin; if its ``configure`` raises, say so and skip it."""
    if entry.name in sub.choices:  # the core's own (refused at registration) stays
        return
    arguments = argparse.ArgumentParser(add_help=False)
    try:
        entry.configure(arguments)
    except Exception as err:  # a broken plugin must not take the other commands with it
        print(
            f"warning: command {entry.name!r} of {entry.distribution} is skipped: its "
            f"configure() raised {type(err).__name__}: {err}",
            file=sys.stderr,
        )
        return
    description = arguments.description or entry.help  # configure() may set a longer one
    p = sub.add_parser(entry.name, help=entry.help, description=description, parents=[arguments])
    p.set_defaults(func=lambda args, run=entry.run: run(args) or 0)


def _plugin_commands(argv: Sequence[str]) -> list[CommandEntry]:
    """The plugins' commands if ``argv`` names a command that is not the core's, else none.

    Only then are the plugins loaded, so that the core's commands start fast.
    """
    name = next((arg for arg in argv if not arg.startswith("-")), None)
    if name is None or name in CORE_COMMANDS:
        return []
    from cockpit_core.plugin.registry import default_registry

    return list(default_registry().commands.values())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cockpit`` console script.

    Returns the exit code: 0 success, 1 a failed check or an error (a message, no
    traceback), 2 invalid arguments (from argparse), 130 interrupted, and
    :data:`BROKEN_PIPE_EXIT` when standard output is closed early, silently.
    """
    try:
        try:
            return _run(argv)
        finally:  # also when argparse exits (--version): fail here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return BROKEN_PIPE_EXIT


def _discard_stdout() -> None:
    """Point standard output at the null device, so the final flush at exit cannot fail."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no file descriptor
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


def _run(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_plugin_commands(argv)).parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        raise
    except CockpitError as err:  # control characters of a user-supplied name escaped
        print(f"error: {escape_controls(str(err))}", file=sys.stderr)
        return 1
    except OSError as err:  # a file that cannot be read or written: no traceback
        print(f"error: {escape_controls(str(err))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
