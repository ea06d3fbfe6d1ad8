"""The ``cockpit`` command line.

Sub-commands::

    cockpit plugins [-v] [--json]   installed plugins, what they register, load errors
    cockpit quantities [--json]     installed quantities with their options
    cockpit schema                  JSON schema of config files (for editor autocomplete)
    cockpit validate CONFIG         check a config file (exit code 0 valid, 1 invalid)
    cockpit check MODULE:FUNCTION   which quantities can be computed for a model, and how
    cockpit demo [...]              train a small model with cockpit on (the main demo)
    cockpit plot LOG [-o OUT]       render the dashboard of a log (.png, .svg or .pdf)
    cockpit new-plugin NAME [...]   generate a plugin distribution (cockpit_core.scaffold)
    cockpit --version               the installed cockpit-core version

Start-up: this module imports only the standard library and :mod:`cockpit_core.errors`;
each sub-command imports what it needs inside its function, so ``--help`` and
``--version`` load neither torch nor the plugins (the package ``__init__`` aside).
``benchmarks/cli_startup.py`` measures it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from cockpit_core.errors import CockpitError

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


def _positive_int(text: str) -> int:
    """``type`` of a count that must be at least 1 (``--steps``, ``--rows``, ``--dpi``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _model_spec(text: str) -> str:
    """``type`` of ``cockpit check``'s model: ``module:function`` or ``file.py:function``."""
    module, _, function = text.rpartition(":")
    if not module or not function:
        raise argparse.ArgumentTypeError(
            f"expected 'module:function' or 'path/to/file.py:function', got {text!r}"
        )
    return text


def _type_name(annotation: Any) -> str:
    """Short readable form of a type annotation (``int | None``, ``Schedule``)."""
    if isinstance(annotation, type):
        return annotation.__name__
    text = str(annotation).replace("typing.", "")
    if "discriminator='kind'" in text:
        return "Schedule | None"
    return text.replace("cockpit_core.schedules.", "")


def _field_rows(config_cls: Any) -> list[dict[str, Any]]:
    rows = []
    for name, field in config_cls.model_fields.items():
        default = field.default if not field.is_required() else None
        rows.append(
            {
                "name": name,
                "type": _type_name(field.annotation),
                "default": default
                if isinstance(default, (int, float, str, bool, type(None)))
                else repr(default),
                "required": field.is_required(),
                "description": field.description or "",
            }
        )
    return rows


_PLUGIN_LISTING: tuple[tuple[str, str], ...] = (
    ("hooks", "hooks"),
    ("quantities", "quantities"),
    ("presets", "presets"),
    ("instruments", "instruments"),
    ("sinks", "sinks"),
    ("providers", "providers"),
    ("kinds", "statistic kinds"),
)
"""JSON key and label of what ``cockpit plugins -v`` lists per plugin, in order."""


def cmd_plugins(args: argparse.Namespace) -> int:
    """List plugins with their state and name conflicts between them.

    Without ``-v`` each plugin shows its quantities, presets, providers and sinks; with
    ``-v`` also the hooks it implements, its instruments, statistic kinds and the reason its
    panels and sinks were skipped, if they were. ``--json`` always has everything.
    """
    from cockpit_core.registry import default_registry

    registry = default_registry()
    conflicts = [str(err) for err in registry.conflicts.values()]
    extension_errors = getattr(registry, "extension_errors", {})
    rows = [
        {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "module": p.module,
            "ok": p.ok,
            "error": p.error,
            "hooks": p.hooks,
            "quantities": p.quantities,
            "presets": p.presets,
            "instruments": p.instruments,
            "sinks": p.sinks,
            "providers": p.providers,
            "kinds": p.kinds,
            "extension_error": extension_errors.get(p.name),
            "conflicts": [c for c in conflicts if f"'{p.distribution}'" in c],
        }
        for p in registry.plugins
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    verbose = getattr(args, "verbose", False)
    listed = (
        _PLUGIN_LISTING
        if verbose
        else tuple((key, key) for key in ("quantities", "presets", "providers", "sinks"))
    )
    if not rows:
        print("No cockpit plugins installed. Install one, e.g. `pip install cockpit-basic`.")
    for r in rows:
        state = "ok" if r["ok"] else f"SKIPPED: {r['error']}"
        print(f"{r['name']}  ({r['distribution']} {r['version']})  {state}")
        for key, label in listed:
            if r[key]:
                print(f"    {label}: {', '.join(r[key])}")
        if verbose and r["extension_error"]:
            print(f"    panels/sinks skipped: {r['extension_error']}")
    for name, err in registry.conflicts.items():
        print(f"CONFLICT {name}: {err}")
    for message in extension_errors.values():
        print(f"PANELS/SINKS SKIPPED {message}")
    return 0


def cmd_quantities(args: argparse.Namespace) -> int:
    """List quantities and their options."""
    from cockpit_core.registry import default_registry

    registry = default_registry()
    rows = []
    for name in registry.names():
        entry = registry.quantities[name]
        doc = (entry.cls.__doc__ or "").strip().splitlines()
        rows.append(
            {
                "name": name,
                "class": entry.cls.__name__,
                "distribution": entry.distribution,
                "version": entry.version,
                "two_step": entry.cls.two_step,
                "summary": doc[0] if doc else "",
                "options": _field_rows(entry.cls.Config),
            }
        )
    presets = {
        p.name: {
            "distribution": p.distribution,
            "description": p.description,
            "quantities": list(map(str, p.quantities)),
        }
        for p in registry.presets.values()
    }
    if args.json:
        print(json.dumps({"quantities": rows, "presets": presets}, indent=2, default=str))
        return 0
    for r in rows:
        print(f"{r['name']}  [{r['distribution']} {r['version']}]  {r['summary']}")
        for o in r["options"]:
            print(f"    {o['name']} = {o['default']!r}  ({o['type']}) {o['description']}")
    for name, p in presets.items():
        print(f"preset {name}  [{p['distribution']}]: {', '.join(p['quantities'])}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Print the JSON schema of config files."""
    from cockpit_core.config import config_json_schema
    from cockpit_core.registry import default_registry

    print(json.dumps(config_json_schema(default_registry()), indent=2))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate a config file without training: the same checks as ``Cockpit.from_config``."""
    from cockpit_core.config import load_config_file, validate_config_data
    from cockpit_core.registry import default_registry

    try:
        data = load_config_file(args.config)
        validated = validate_config_data(data, default_registry(), args.config)
    except CockpitError as err:
        print(err, file=sys.stderr)
        problems = len(getattr(err, "errors", ())) or 1
        print(f"{problems} problem{'s' if problems > 1 else ''} found.", file=sys.stderr)
        return 1
    keys = ", ".join(q.key for q in validated.quantities)
    sinks = ", ".join(s.name for s in validated.sinks)
    print(
        f"{args.config}: valid ({len(validated.quantities)} quantities: {keys}"
        + (f"; sinks: {sinks}" if sinks else "")
        + ")"
    )
    return 0


def load_model_factory(spec: str) -> Any:
    """Import ``module:function`` (``module`` may also be a path to a ``.py`` file)."""
    import importlib
    import importlib.util
    from pathlib import Path

    from cockpit_core.errors import ConfigError

    if ":" not in spec:
        raise ConfigError([("model", f"expected 'module:function', got {spec!r}")])
    module_name, func_name = spec.rsplit(":", 1)
    try:
        if module_name.endswith(".py"):
            file_spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if file_spec is None or file_spec.loader is None:
                raise ImportError(f"cannot load {module_name}")
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:
        raise ConfigError([("model", f"cannot import {module_name!r}: {err}")]) from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ConfigError([("model", f"{module_name!r} has no function {func_name!r}")])
    return factory


def _per_sample_cross_entropy(outputs: Any, targets: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(outputs, targets, reduction="none")


def _per_sample_mse(outputs: Any, targets: Any) -> Any:
    import torch

    losses = torch.nn.functional.mse_loss(outputs, targets, reduction="none")
    return losses.flatten(1).sum(1) if losses.dim() > 1 else losses


CHECK_LOSSES = {"cross_entropy": _per_sample_cross_entropy, "mse": _per_sample_mse}
"""``cockpit check --loss``: per-sample losses the ``torch.func`` provider may use."""


def _names(spec: str) -> list[str]:
    return [name.strip() for name in spec.split(",") if name.strip()]


@contextlib.contextmanager
def _current_directory_importable() -> Iterator[None]:
    """Let ``module:function`` name a module of the current directory, as ``python -m`` does.

    The ``cockpit`` console script puts its own folder (``.venv/bin``) first on
    ``sys.path``, not the current directory; the entry is removed again afterwards.
    """
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(cwd)


def cmd_check(args: argparse.Namespace) -> int:
    """Report which quantities can be computed for a model."""
    with _current_directory_importable():
        return _check(args)


def _check(args: argparse.Namespace) -> int:
    from cockpit_core.cockpit import Cockpit

    model = load_model_factory(args.model)()
    options = {}
    if args.backend is not None:
        options["backend"] = args.backend if "," not in args.backend else _names(args.backend)
    if args.config:
        cp = Cockpit.from_config(args.config, model.named_parameters(), **options)
    else:
        spec = args.quantities
        quantities = spec if "," not in spec else _names(spec)
        cp = Cockpit(model.named_parameters(), quantities, **options)
    cp.attach(model, CHECK_LOSSES[args.loss] if args.loss else None)
    report = cp.check(model)
    print(report)
    return 0 if report.ok else 1


def cmd_plot(args: argparse.Namespace) -> int:
    """Render the dashboard of a log file."""
    from pathlib import Path

    from cockpit_core.dashboard import plot

    out = Path(args.output) if args.output else Path(args.log).with_name("dashboard.png")
    try:
        path = plot(args.log, out, title=args.title, rows=args.rows, dpi=args.dpi)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"Dashboard written to {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo training; an unknown preset or quantity is a usage error (exit 2)."""
    from cockpit_core.demo import demo_quantities, run_demo

    try:
        demo_quantities(args.preset)
    except ValueError as err:  # ConfigError: the message names the installed ones
        messages = [message for _, message in getattr(err, "errors", ())] or [str(err)]
        args.usage_error(f"argument --preset: {' '.join(messages)}")
    run_demo(preset=args.preset, steps=args.steps, out=args.out, seed=args.seed)
    return 0


def cmd_new_plugin(args: argparse.Namespace) -> int:
    """Generate a plugin distribution (:func:`cockpit_core.scaffold.new_plugin`)."""
    from cockpit_core.scaffold import new_plugin, next_steps

    target = new_plugin(
        args.name,
        args.dir,
        with_instrument=args.with_instrument,
        with_provider=args.with_provider,
    )
    print(next_steps(target))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``cockpit`` command."""
    parser = argparse.ArgumentParser(
        prog="cockpit",
        description="A visual and statistical debugger for PyTorch training.",
        epilog="Run `cockpit COMMAND --help` for what a command does and its options.",
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
        "registers, then name conflicts between plugins.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list each plugin's hooks, instruments and statistic kinds",
    )
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser(
        "quantities",
        help="list installed quantities and their options",
        description="List every installed quantity with its distribution, a one-line summary "
        "and its options (name, default, type, description), then the presets and their "
        "members.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_quantities)

    p = sub.add_parser(
        "schema",
        help="print the JSON schema of config files",
        description="Print the JSON schema of cockpit config files, built from the installed "
        "quantities and sinks; point an editor at it for completion and checks "
        "(cockpit schema > cockpit.schema.json).",
    )
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "check",
        help="list which quantities can be computed for a model (exit 1 if any cannot)",
        description="Build the model that FUNCTION returns and report, for each quantity, "
        "whether it can be computed and which statistics provider serves each parameter. "
        "MODULE is a module importable from the current directory or a path to a .py file, "
        "e.g. cockpit check models.py:make_model --loss cross_entropy. Exit code 0 if every "
        "quantity can be computed, 1 if not.",
    )
    p.add_argument(
        "model",
        type=_model_spec,
        metavar="MODULE:FUNCTION",
        help="'module:function' or 'path/to/file.py:function' returning the model",
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
        choices=sorted(CHECK_LOSSES),
        default=None,
        help="the training loss; lets torch.func serve parameters no cheaper provider can "
        "(e.g. a learned positional embedding owned by the model itself)",
    )
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "validate",
        help="check a config file (exit 0 if valid, 1 if not)",
        description="Check a config file without training: the checks of "
        "Cockpit.from_config (quantity names, options, sinks), every problem with its field "
        "path. Exit code 0 if the file is valid, 1 if not.",
    )
    p.add_argument("config", help="path of a .toml, .yaml/.yml or .json config file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "demo",
        help="train a small network on the bundled digits data with cockpit on",
        description="Train a 64-32-10 MLP on scikit-learn's bundled 8x8 digits (nothing is "
        "downloaded) with cockpit tracking the chosen quantities, and write the log, "
        "output.json and the dashboard picture into a run folder. Progress goes to standard "
        "error: a bar on a terminal, otherwise a line at every tenth of the run. Needs "
        "scikit-learn: pip install 'cockpit-core[demo]'.",
    )
    p.add_argument(
        "--preset", default="economy", help="preset or comma-separated quantities (default economy)"
    )
    p.add_argument("--steps", type=_positive_int, default=300, help="training steps (default 300)")
    p.add_argument("--out", default=None, help="run folder (default runs/demo-<time>)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "plot",
        help="render the dashboard of a log (.jsonl or .json)",
        description="Render the dashboard of a log written by a Cockpit (log=... writes "
        ".jsonl, cp.write(...) .json) into a .png, .svg or .pdf picture.",
    )
    p.add_argument("log", help="a log written with log=... (.jsonl) or cp.write(...) (.json)")
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="picture to write: .png, .svg or .pdf (default: dashboard.png next to the log)",
    )
    p.add_argument("--title", default=None, help="figure title (default: a run summary)")
    p.add_argument("--rows", type=_positive_int, default=4, help="panels per column (default 4)")
    p.add_argument("--dpi", type=_positive_int, default=100, help="resolution of .png output")
    p.set_defaults(func=cmd_plot)

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
    p.set_defaults(func=cmd_new_plugin)
    for command in sub.choices.values():  # a command's own check of its arguments: exit 2
        command.set_defaults(usage_error=command.error)
    return parser


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
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        raise
    except CockpitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a file that cannot be read or written: no traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
