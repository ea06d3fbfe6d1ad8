"""The import structure of the core and every plugin, read from the source (``ast``).

* no import circle, anywhere: imports at module level, inside functions and in
  ``TYPE_CHECKING`` blocks all count (a circle hidden in a function is still a circle in
  the design);
* the core imports no first-party plugin (built-ins reach it through entry points, as a
  third party's plugin does);
* each distribution declares exactly what it imports: every third-party module imported is
  a declared dependency (a required one, or an extra's for imports made when a feature is
  used, e.g. matplotlib when a panel is drawn), and every required dependency is imported
  somewhere.

A failure names the modules and the line, so the fix (move the shared piece down, declare
the dependency) is where the message points.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Distribution:
    """One installable distribution of this repository and its one top-level package."""

    name: str
    package: Path
    required: set[str] = field(default_factory=set)
    optional: set[str] = field(default_factory=set)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(spec: str) -> str:
    return _normalize(re.split(r"[\s<>=!~;\[]", spec.strip(), maxsplit=1)[0])


def _distributions() -> list[Distribution]:
    found = []
    for pyproject in [
        ROOT / "pyproject.toml",
        *sorted(ROOT.glob("plugins/cockpit-*/pyproject.toml")),
    ]:
        project = tomllib.loads(pyproject.read_text())["project"]
        packages = [
            p for p in pyproject.parent.iterdir() if p.is_dir() and (p / "__init__.py").exists()
        ]
        packages = [p for p in packages if p.name.startswith("cockpit_")]
        assert len(packages) == 1, f"{pyproject}: expected one cockpit_* package, found {packages}"
        extras = project.get("optional-dependencies", {})
        found.append(
            Distribution(
                name=_normalize(project["name"]),
                package=packages[0],
                required={_requirement_name(s) for s in project.get("dependencies", [])},
                optional={_requirement_name(s) for specs in extras.values() for s in specs},
            )
        )
    return found


DISTRIBUTIONS = _distributions()
DISTRIBUTION_OF = {d.package.name: d.name for d in DISTRIBUTIONS}
"""Top-level package -> the distribution of this repository that holds it."""
FIRST_PARTY = set(DISTRIBUTION_OF)


def _module_files() -> dict[str, Path]:
    modules = {}
    for dist in DISTRIBUTIONS:
        for path in dist.package.rglob("*.py"):
            parts = list(path.relative_to(dist.package.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


MODULES = _module_files()


@dataclass(frozen=True)
class Import:
    """One imported name: the module that provides it, and where the import is."""

    target: str
    line: int


def _reexports() -> dict[tuple[str, str], str]:
    """``(package, name) -> module`` for names a package ``__init__`` re-exports.

    Both ``from pkg.mod import name`` in the ``__init__`` and the lazy ``_EXPORTS`` tables
    (``"name": "pkg.mod"``) count, so ``from cockpit_core import Cockpit`` is an import of
    ``cockpit_core.engine.cockpit``, not of everything the package exports.
    """
    found = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
                for alias in node.names:
                    found[(module, alias.asname or alias.name)] = node.module
        for name, target in re.findall(r'"(\w+)":\s*"([\w.]+)"', text):
            if target in MODULES:
                found[(module, name)] = target
    return found


REEXPORTS = _reexports()


def _owner(name: str) -> str:
    """The longest known module prefix of ``name`` (else its top-level name)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return parts[0]


def _imports(module: str) -> list[Import]:
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(_owner(a.name), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in MODULES:
                    target = full
                elif (source, alias.name) in REEXPORTS:
                    target = REEXPORTS[(source, alias.name)]
                else:
                    target = _owner(source)
                found.append(Import(target, node.lineno))
    return [i for i in found if i.target != module]


GRAPH = {m: _imports(m) for m in MODULES}


def _circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each as one circle."""
    edges = {
        m: sorted({i.target for i in imps if i.target in MODULES}) for m, imps in GRAPH.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(MODULES)))
    try:
        for module in sorted(edges):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return groups


def _describe(group: list[str]) -> str:
    lines = []
    for module in group:
        for imp in GRAPH[module]:
            if imp.target in group:
                lines.append(
                    f"  {MODULES[module].relative_to(ROOT)}:{imp.line} imports {imp.target}"
                )
    return "\n".join(sorted(set(lines)))


def test_no_import_circle_in_the_core_or_any_plugin():
    circles = _circles()
    assert not circles, "import circles (move the shared piece down):\n" + "\n\n".join(
        _describe(group) for group in circles
    )


RUNTIME_ONLY = {
    # torch.utils.tensorboard.SummaryWriter imports it: required, never imported by name
    "cockpit-tensorboard": {"tensorboard"},
    # the Trainer needs it at run time (transformers does not require it): never imported
    "cockpit-huggingface": {"accelerate"},
    # its pictures are drawn by the .png renderer cockpit-dashboard registers: never imported
    "cockpit-demo": {"cockpit-dashboard"},
    # its health preset names their quantities (loss, grad_norm; activations, logits; attention)
    "cockpit-health": {"cockpit-basic", "cockpit-activations", "cockpit-attention"},
}
"""Dependencies a distribution needs at run time without importing them itself."""


def test_the_core_imports_no_first_party_plugin():
    plugins = FIRST_PARTY - {"cockpit_core"}
    found = [
        f"{MODULES[m].relative_to(ROOT)}:{imp.line} imports {imp.target}"
        for m in MODULES
        if m.split(".")[0] == "cockpit_core"
        for imp in GRAPH[m]
        if imp.target.split(".")[0] in plugins
    ]
    assert not found, (
        "the core names first-party plugins (reach them through hooks, as a third party's):\n"
        + "\n".join(found)
    )


def _providers() -> dict[str, set[str]]:
    """Top-level import name -> normalized names of the installed distributions providing it."""
    return {
        name: {_normalize(d) for d in dists}
        for name, dists in metadata.packages_distributions().items()
    }


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda d: d.name)
def test_each_distribution_declares_exactly_what_it_imports(dist: Distribution):
    providers = _providers()
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    own = dist.package.name
    needed: dict[str, list[str]] = {}  # distribution -> where it is imported
    for module, path in MODULES.items():
        if not path.is_relative_to(dist.package):
            continue
        for imp in GRAPH[module]:
            top = imp.target.split(".")[0]
            if top in stdlib or top == own:
                continue
            if top in FIRST_PARTY:
                names = {DISTRIBUTION_OF[top]}
            else:
                names = providers.get(top)
                assert names, (
                    f"{path.relative_to(ROOT)}:{imp.line}: no installed distribution provides {top!r}"
                )
            for name in names:
                needed.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{imp.line}")
    undeclared = {
        name: where[0]
        for name, where in needed.items()
        if name not in dist.required | dist.optional
    }
    assert not undeclared, f"{dist.name} imports what it does not declare: {undeclared}"
    unused = sorted(dist.required - set(needed) - RUNTIME_ONLY.get(dist.name, set()))
    assert not unused, f"{dist.name} declares dependencies it never imports: {unused}"


def test_mypy_checks_the_core_and_every_plugin():
    checked = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    packages = {str(d.package.relative_to(ROOT)) for d in DISTRIBUTIONS}
    assert packages <= checked, f"add to [tool.mypy] files in pyproject.toml: {packages - checked}"


STRICT_FLAGS = ("disallow_untyped_defs", "disallow_any_generics", "warn_return_any")
"""Three of the strict flags the pyproject's override sets (the rest travel with them)."""


def test_mypy_strict_flags_cover_the_core_and_every_plugin():
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = {
        module
        for o in overrides
        if all(o.get(flag) is True for flag in STRICT_FLAGS)
        for module in o["module"]
    }
    missing = sorted(d.package.name for d in DISTRIBUTIONS if f"{d.package.name}.*" not in strict)
    assert not missing, f"add to the strict [[tool.mypy.overrides]] of pyproject.toml: {missing}"
    relaxed = [o["module"] for o in overrides if any(o.get(f) is False for f in STRICT_FLAGS)]
    assert not relaxed, f"mypy's strict flags are turned off again for {relaxed}"
