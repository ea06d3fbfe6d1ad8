"""The implementation of each ``cockpit`` sub-command: one ``cmd_*`` function per command.

Each function takes the parsed arguments of :mod:`cockpit_core.cli.main` and returns the exit
code. Start-up: :func:`cockpit_core.cli.main.build_parser` imports this module to bind the
commands, so at module level it imports only the standard library and
:mod:`cockpit_core.errors`; each command imports what it needs (torch, the registry, the
plugins) inside its function, when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from cockpit_core.errors import CockpitError, escape_controls

_LABELS = {"kinds": "statistic kinds"}
"""Labels of ``cockpit plugins -v`` that differ from the JSON key."""

_BRIEF = ("quantities", "presets", "providers", "sinks", "diagnoses", "commands")
"""What ``cockpit plugins`` lists per plugin without ``-v``; with it, every sort."""


def cmd_plugins(args: argparse.Namespace) -> int:
    """List plugins with their state and name conflicts between them.

    Without ``-v`` each plugin shows its quantities, presets, providers, sinks and
    diagnoses; with ``-v`` also the hooks it implements, its instruments, statistic kinds and
    the reason its panels and sinks were skipped, if they were. ``--json`` always has
    everything.

    The listing comes from a cache while nothing it depends on changed (installed
    distributions, entry points, plugin and core files, ``COCKPIT_PLUGINS_DIR``), so that
    listing does not import torch or the plugins; see :mod:`cockpit_core.plugin.listing`.
    Its output is that of a full load; with ``-v`` one more line on standard error says the
    listing came from the cache. ``--refresh`` (or ``COCKPIT_NO_CACHE=1``) loads the plugins.
    """
    from cockpit_core.plugin.listing import cache_note, plugin_listing

    listing = plugin_listing(refresh=getattr(args, "refresh", False))
    rows = listing.rows
    verbose = getattr(args, "verbose", False)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        if not rows:
            print("No cockpit plugins installed. Install one, e.g. `pip install cockpit-basic`.")
        for r in rows:
            state = "ok" if r["ok"] else f"SKIPPED: {r['error']}"
            print(f"{r['name']}  ({r['distribution']} {r['version']})  {state}")
            for key, names in r.items():
                listed = key in _BRIEF or (verbose and key not in ("conflicts", "ok"))
                if listed and isinstance(names, list) and names:
                    print(f"    {_LABELS.get(key, key)}: {', '.join(names)}")
            if verbose and r["extension_error"]:
                print(f"    panels/sinks skipped: {r['extension_error']}")
        for name, message in listing.conflicts:
            print(f"CONFLICT {name}: {message}")
        for message in listing.extension_errors:
            print(f"PANELS/SINKS SKIPPED {message}")
    if verbose and listing.cached_at is not None:
        sys.stdout.flush()  # the note is the last line, also when both go to one terminal
        print(cache_note(listing), file=sys.stderr)
    return 0


def _type_name(annotation: Any) -> str:
    """Short readable form of a type annotation (``int | None``, ``Schedule``)."""
    if isinstance(annotation, type):
        return annotation.__name__
    text = str(annotation).replace("typing.", "")
    if "discriminator='kind'" in text:
        return "Schedule | None"
    return text.replace("cockpit_core.schedules.", "")


def _field_rows(config_cls: Any) -> list[dict[str, Any]]:
    """One row per option of a quantity's pydantic ``Config``, as ``cockpit quantities`` lists it."""
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


def cmd_quantities(args: argparse.Namespace) -> int:
    """List quantities and their options."""
    from cockpit_core.plugin.registry import default_registry

    registry = default_registry()
    rows: list[dict[str, Any]] = []
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
    presets: dict[str, dict[str, Any]] = {
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
    from cockpit_core.config.files import config_json_schema
    from cockpit_core.plugin.registry import default_registry

    print(json.dumps(config_json_schema(default_registry()), indent=2))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate a config file without training: the same checks as ``Cockpit.from_config``."""
    from cockpit_core.config.files import load_config_file, validate_config_data
    from cockpit_core.plugin.registry import default_registry

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


CHECK_LOSSES = ("cross_entropy", "mse")
"""``cockpit check --loss``: names of :data:`cockpit_core.check.sample.PER_SAMPLE_LOSSES`."""


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
    from cockpit_core.engine.cockpit import Cockpit
    from cockpit_core.engine.losses import PER_SAMPLE_LOSSES

    model, sample = _model_and_sample(load_model_factory(args.model)(), args)
    options: dict[str, Any] = {}  # Cockpit's keyword arguments
    if args.backend is not None:
        options["backend"] = args.backend if "," not in args.backend else _names(args.backend)
    if args.config:
        cp = Cockpit.from_config(args.config, model.named_parameters(), **options)
    else:
        spec = args.quantities
        quantities = spec if "," not in spec else _names(spec)
        cp = Cockpit(model.named_parameters(), quantities, **options)
    cp.attach(model, PER_SAMPLE_LOSSES[args.loss] if args.loss else None)
    batch_loss = None if sample is None or callable(sample) else args.loss
    report = cp.check(model, sample, loss=batch_loss)
    print(report)
    return 0 if report.ok else 1


def _model_and_sample(made: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """The model and the sample of ``cockpit check``: from FUNCTION, or a random batch.

    FUNCTION returns a model, ``(model, batch)`` or ``(model, sample)``; ``--input-shape``
    or ``--vocab``/``--seq-len`` build a random batch of ``--batch`` samples instead.
    """
    import torch

    from cockpit_core.errors import ConfigError

    model, sample = made, None
    if isinstance(made, (tuple, list)) and len(made) == 2:
        model, sample = made
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            [
                (
                    "model",
                    f"{args.model} must return a torch.nn.Module, (model, batch) or "
                    f"(model, sample), got {type(made).__name__}",
                )
            ]
        )
    tokens = args.vocab is not None or args.seq_len is not None
    if args.input_shape is not None or tokens:
        if sample is not None:
            args.usage_error(
                f"{args.model} returns a batch already: drop --input-shape/--vocab/--seq-len"
            )
        if args.input_shape is not None and tokens:
            args.usage_error("give either --input-shape or --vocab and --seq-len, not both")
        if tokens and (args.vocab is None or args.seq_len is None):
            args.usage_error("token ids need both --vocab V and --seq-len T")
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
        generator = torch.Generator().manual_seed(0)
        if tokens:
            shape = (args.batch, args.seq_len)
            sample = torch.randint(args.vocab, shape, generator=generator).to(device)
        else:
            dtype = first.dtype if first is not None and first.is_floating_point() else None
            sample = torch.randn((args.batch, *args.input_shape), generator=generator)
            sample = sample.to(device=device, dtype=dtype)
    if sample is not None and not callable(sample) and args.loss is None:
        args.usage_error(
            "a batch needs --loss (cross_entropy or mse) to compute its loss; or let "
            f"{args.model} return (model, sample) with sample(model) returning the loss"
        )
    return model, sample


def cmd_plot(args: argparse.Namespace) -> int:
    """Render the dashboard of a log file; of several, one dashboard comparing the runs.

    The renderer registered for the output's suffix draws it (``register_renderers``); an
    unknown suffix is an error naming the installed ones.
    """
    from pathlib import Path

    from cockpit_core.plugin.registry import default_registry

    logs = args.logs
    default = "dashboard.png" if len(logs) == 1 else "compare.png"
    out = Path(args.output) if args.output else Path(logs[0]).with_name(default)
    labels = _names(args.labels) if args.labels is not None else None
    if labels is not None and len(labels) != len(logs):
        args.usage_error(f"argument --labels: got {len(labels)} labels for {len(logs)} logs")
    renderer = default_registry().renderer(out)
    try:
        path = renderer.render(
            logs[0] if len(logs) == 1 else logs,
            out,
            title=args.title,
            rows=args.rows,
            dpi=args.dpi,
            labels=labels,
            diagnose=args.diagnose,
        )
    except (OSError, ValueError) as err:
        print(f"error: {escape_controls(str(err))}", file=sys.stderr)
        return 1
    print(f"{'Dashboard' if len(logs) == 1 else 'Comparison'} written to {path}")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Run the diagnoses over each log; exit 0 (nothing >= warning), 1, or 2 (unreadable)."""
    from cockpit_core.diagnosing.run import run_cli

    return run_cli(
        args.logs, as_json=args.json, only=args.only, config=args.config, settings=args.settings
    )


def cmd_new_plugin(args: argparse.Namespace) -> int:
    """Generate a plugin distribution (:func:`cockpit_core.cli.scaffold.new_plugin`)."""
    from cockpit_core.cli.scaffold import new_plugin, next_steps

    target = new_plugin(
        args.name,
        args.dir,
        with_instrument=args.with_instrument,
        with_provider=args.with_provider,
    )
    print(next_steps(target))
    return 0
