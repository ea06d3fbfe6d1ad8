"""Start-up time of the ``cockpit`` command: ``--help``, ``--version``, ``plugins`` (issue 20).

Every command runs ``--repeats`` times, each in a fresh process, interleaved (one of each
per round, so that drift of the machine's load touches all alike). The table gives the
median wall-clock time and the median CPU time of the process (user + system, from
``getrusage(RUSAGE_CHILDREN)``; steadier than wall-clock time when other processes share the
cores), and, from one more run under ``python -X importtime``, whether torch was imported,
which top-level import pulled it in, and the slowest top-level imports.

Two variants of the package for ``--help`` and ``--version``:

- ``installed``: the package as it is, started like the ``cockpit`` console script
  (``python .venv/bin/cockpit ...``);
- ``lazy __init__``: a prototype of a PEP 562 lazy ``cockpit_core/__init__.py``. A launcher
  script puts a stand-in ``cockpit_core`` package module into ``sys.modules`` whose
  module-level ``__getattr__`` imports each name of the real ``__init__`` (read from its
  source) from its submodule on first use, then calls ``cockpit_core.cli.main.main``. It shows
  what the command costs once ``import cockpit_core`` is cheap; its output is compared with
  the installed variant's.

``cockpit plugins -v`` runs twice per round, with a listing cache of its own (a temporary
``XDG_CACHE_HOME``): ``cold`` with ``--refresh`` (imports every plugin and torch, rewrites
the cache), then ``warm`` (served from the cache that run wrote; see
:mod:`cockpit_core.plugin.listing`). The report counts the warm runs that were served from
the cache (``-v`` says so on standard error): a file of the core or of a plugin edited
during the measurement invalidates it.

Writes ``benchmarks/results/cli_startup.md``::

    .venv/bin/python benchmarks/cli_startup.py [--repeats 3] [--note TEXT]
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

CACHE_NOTE = "(listed from cache of "
"""How ``cockpit plugins -v`` starts the line that says the listing came from the cache."""

COLD, WARM = "cold (cache refreshed)", "warm (from cache)"

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cockpit_core"

LAUNCHER = '''"""Run cockpit_core.cli.main.main with a lazy stand-in for the package __init__ (PEP 562)."""
import importlib
import sys
import types

EXPORTS = {exports!r}
package = types.ModuleType("cockpit_core")
package.__path__ = [{package!r}]
package.__file__ = {init!r}


def __getattr__(name):
    if name == "__version__":
        from importlib import metadata

        value = metadata.version("cockpit-core")
    elif name == "extend":
        from cockpit_backpack import extend as value
    elif name in EXPORTS:
        value = getattr(importlib.import_module(EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'cockpit_core' has no attribute {{name!r}}")
    setattr(package, name, value)
    return value


package.__getattr__ = __getattr__
sys.modules["cockpit_core"] = package
from cockpit_core.cli.main import main  # noqa: E402

sys.exit(main())
'''


def exports() -> dict[str, str]:
    """Name -> submodule of every ``from cockpit_core.X import name`` in the real ``__init__``."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cockpit_core."):
            out.update({alias.asname or alias.name: node.module for alias in node.names})
    return out


def commands(python: str, launcher: Path) -> list[tuple[str, str, list[str]]]:
    """``(label, variant, argv)`` of every measured command."""
    script = str(Path(python).with_name("cockpit"))
    rows = [
        ("python -c pass", "interpreter", [python, "-c", "pass"]),
        ("import torch", "interpreter", [python, "-c", "import torch"]),
        ("import cockpit_core", "installed", [python, "-c", "import cockpit_core"]),
    ]
    for args in (["--help"], ["--version"]):
        label = "cockpit " + " ".join(args)
        rows.append((label, "installed", [python, script, *args]))
        rows.append((label, "lazy __init__", [python, str(launcher), *args]))
    rows.append(
        ("cockpit plugins -v --refresh", COLD, [python, script, "plugins", "-v", "--refresh"])
    )
    rows.append(("cockpit plugins -v", WARM, [python, script, "plugins", "-v"]))
    return rows


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str, str]:
    """Wall-clock seconds, CPU seconds (user + system), standard output and error of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout, out.stderr


def import_profile(argv: list[str], env: dict[str, str]) -> dict:
    """Torch imported?, the chain of imports that pulled it in, the slowest top-level ones."""
    err = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, cwd=ROOT, env=env
    ).stderr
    top, chain, parent_depth = [], [], -1
    for line in err.splitlines():  # a module's line follows those of the imports it made
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, field = line.split("|", 2)
        name, depth = field.strip(), (len(field) - len(field.lstrip()) - 1) // 2
        if name == "torch" and not chain:
            chain, parent_depth = [name], depth - 1
        elif chain and depth == parent_depth:
            chain.insert(0, name)
            parent_depth -= 1
        if depth == 0:
            top.append((int(cumulative) / 1000, name))
    top.sort(reverse=True)
    return {"torch": bool(chain), "via": " > ".join(chain[:-1]), "top": top[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per command")
    parser.add_argument(
        "--output", default=str(Path(__file__).parent / "results" / "cli_startup.md")
    )
    parser.add_argument(
        "--note", default="", help="a sentence for the report, e.g. on the machine's load"
    )
    args = parser.parse_args()
    python = sys.executable
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "COCKPIT_NO_CACHE"}
        env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # the user's cache stays untouched
        launcher = Path(tmp) / "cockpit_lazy.py"
        launcher.write_text(
            LAUNCHER.format(
                exports=exports(), package=str(PACKAGE), init=str(PACKAGE / "__init__.py")
            )
        )
        rows = commands(python, launcher)
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        outputs: dict[tuple[str, str], str] = {}
        hits = 0
        for _ in range(args.repeats):
            for label, variant, argv in rows:
                wall, cpu, out, err = timed(argv, env)
                times.setdefault((label, variant), []).append((wall, cpu))
                outputs[(label, variant)] = out
                hits += variant == WARM and CACHE_NOTE in err
                print(f"{label:28s} {variant:22s} wall {wall:6.2f}s  cpu {cpu:6.2f}s", flush=True)
        profiles = {(label, variant): import_profile(argv, env) for label, variant, argv in rows}
    load_after = os.getloadavg()
    path = Path(args.output)
    path.write_text(
        render(args.repeats, times, outputs, profiles, (load_before, load_after), hits, args.note)
    )
    print(f"wrote {path}")


def render(repeats, times, outputs, profiles, loads, hits, note) -> str:
    """The Markdown report."""
    load_before, load_after = loads
    medians = {
        key: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for key, runs in times.items()
    }
    lines = [
        "# Start-up time of the `cockpit` command (issue 20)",
        "",
        f"`benchmarks/cli_startup.py --repeats {repeats}`, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {metadata.version('torch')}, cockpit-core {metadata.version('cockpit-core')}. "
        f"Load average (1 min) {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the "
        "end: other processes shared the cores, so wall-clock times are stretched; CPU time "
        "(user + system of the process) is the steadier number. Medians of "
        f"{repeats} fresh processes each.",
        "",
        *([note, ""] if note else []),
        "`installed`: the package as it is (`python .venv/bin/cockpit ...`). `lazy __init__`: "
        "the same CLI with a PEP 562 lazy stand-in for `cockpit_core/__init__.py` (see the "
        "script's docstring), i.e. what the command costs once `import cockpit_core` no longer "
        "imports torch. `cold` / `warm`: `cockpit plugins -v` with `--refresh` (imports the "
        "plugins and rewrites the listing cache) and then without (served from that cache), "
        "with a cache folder of the benchmark's own.",
        "",
        "| command | variant | wall (s) | CPU (s) | torch imported | imported through | slowest "
        "top-level imports (cumulative ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, variant in times:
        wall, cpu = medians[(label, variant)]
        prof = profiles[(label, variant)]
        top = ", ".join(f"{name} {ms:.0f}" for ms, name in prof["top"])
        lines.append(
            f"| `{label}` | {variant} | {wall:.2f} | {cpu:.2f} | "
            f"{'yes' if prof['torch'] else 'no'} | {prof['via'] or ''} | {top} |"
        )
    same = [
        label
        for label, variant in times
        if variant == "lazy __init__" and outputs[(label, variant)] == outputs[(label, "installed")]
    ]
    cold = outputs[("cockpit plugins -v --refresh", COLD)]
    warm = outputs[("cockpit plugins -v", WARM)]
    lines += [
        "",
        f"Same standard output in both variants: {', '.join(f'`{s}`' for s in same) or 'none'}.",
        f"`cockpit plugins -v`: warm runs served from the cache: {hits} of {repeats}; standard "
        f"output {'the same as' if warm == cold else 'different from'} the cold run's.",
        "",
        *findings(medians, profiles),
    ]
    return "\n".join(lines)


def findings(medians, profiles) -> list[str]:
    """What the table shows, with its numbers (CPU medians)."""

    def cpu(label: str, variant: str) -> float:
        return medians[(label, variant)][1]

    torch_cpu = cpu("import torch", "interpreter")
    via = profiles[("import cockpit_core", "installed")]["via"] or "-"
    plugins_via = profiles[("cockpit plugins -v --refresh", COLD)]["via"] or "-"
    warm_torch = profiles[("cockpit plugins -v", WARM)]["torch"]
    out = ["## What it shows", ""]
    for label in ("cockpit --help", "cockpit --version"):
        torch_loaded = profiles[(label, "installed")]["torch"]
        why = (
            f"the package `__init__` imports torch (`import torch` alone: {torch_cpu:.2f} s) "
            f"through `{via}`; a lazy `__init__` (PEP 562) avoids it"
            if torch_loaded
            else "no torch: the package `__init__` exports its names lazily (PEP 562), and "
            "`cockpit_core/cli/main.py` imports only the standard library and "
            "`cockpit_core.errors`; each command imports what it needs when it runs"
        )
        out.append(
            f"- `{label}`: {cpu(label, 'installed'):.2f} s CPU as installed "
            f"({cpu(label, 'lazy __init__'):.2f} s with the script's lazy stand-in): {why}."
        )
    out += [
        f"- `cockpit plugins` cold (`--refresh`): {cpu('cockpit plugins -v --refresh', COLD):.2f} "
        f"s: torch is imported (through `{plugins_via}`). The registry imports the quantity, "
        "provider and panel base classes, and every plugin module defines its quantities as "
        "subclasses of `Quantity`, so loading the plugins needs torch.",
        f"- `cockpit plugins` warm: {cpu('cockpit plugins -v', WARM):.2f} s, torch "
        f"{'imported' if warm_torch else 'not imported'}: the listing of the last full load is "
        "served from the cache (`cockpit_core/plugin/listing.py`) while its fingerprint "
        "(interpreter, installed distributions, `cockpit` entry points, files of the plugin "
        "packages and of `cockpit_core`, `COCKPIT_PLUGINS_DIR`) is unchanged.",
        "",
    ]
    return out


if __name__ == "__main__":
    main()
