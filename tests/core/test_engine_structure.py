"""The engine's shape: one owner per piece of state, settings declared once.

These tests read the source (``ast``) rather than run it, so a refactoring that reaches into
another module's private attributes (in the core or any plugin) fails here, with the place. Import circles, anywhere in
the core and the plugins, are ``test_import_structure.py``'s.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import cockpit_core
from cockpit_core import Cockpit
from cockpit_core.config.settings import CockpitSettings
from cockpit_core.engine.cockpit import TRAINING_OBJECTS

CORE = Path(cockpit_core.__file__).parent
ROOT = CORE.parent
PACKAGES = (CORE, *sorted(ROOT.glob("plugins/cockpit-*/cockpit_*")))
"""The core and every plugin's package: the code whose modules keep their privates."""

LIBRARY_PRIVATES = {
    # torch keeps a module's hooks in these dicts; reading them is the only way to see
    # whether BackPACK's or another tool's hooks are on a module (cockpit-autodiff)
    "_forward_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_is_full_backward_hook",
    # the view a tensor was made from (aliasing checks on outputs and losses)
    "_base",
    # padding of a Conv module as F.pad wants it (what Conv._conv_forward uses)
    "_reversed_padding_repeated_twice",
    # torch.nn.functional's own checks of multi_head_attention_forward's inputs, run again
    # to interpret them exactly as torch does (cockpit-hooks' attention rule)
    "_mha_shape_check",
    "_canonical_mask",
    "_none_or_dtype",
    # a tensor's version counter, read to see in-place changes
    "_version",
    # NamedTuple's public API is spelled with an underscore
    "_asdict",
}
"""Private names of libraries that cockpit reads on purpose, each with the reason."""


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, and attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if name.startswith("_")}


def _private_reads(path: Path) -> list[str]:
    """``obj._name`` where ``_name`` is private to another module (or another library)."""
    tree = ast.parse(path.read_text())
    own = _defined_privates(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__"):
            continue
        if attr in own or attr in LIBRARY_PRIVATES:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue  # its own (or an inherited) attribute
        root = owner
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in ("sys", "torch"):
            continue  # sys._getframe, torch.nn.modules.batchnorm._BatchNorm: library names
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _private_imports(path: Path) -> list[str]:
    """``from cockpit_x.module import _name``: a private name taken from another module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cockpit_"):
            rel = Path(*(node.module or "").split("."))
            folders = [pkg.parent / rel for pkg in PACKAGES]
            for alias in node.names:
                if any((f / f"{alias.name}.py").exists() for f in folders):
                    continue  # a private module of the same package (``_binning``)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    problems = [
        p for pkg in PACKAGES for f in sorted(pkg.rglob("*.py")) for p in _private_imports(f)
    ]
    assert not problems, "private names imported from another module:\n" + "\n".join(problems)


def test_no_module_reads_another_modules_private_attributes():
    problems = [p for pkg in PACKAGES for f in sorted(pkg.rglob("*.py")) for p in _private_reads(f)]
    assert not problems, "private attributes read from outside their owner:\n" + "\n".join(problems)


def test_the_constructor_takes_exactly_the_settings_of_the_config_file():
    params = inspect.signature(Cockpit.__init__).parameters
    # the model, its loss and its optimizer are objects of the training script, not settings
    script = ("self", "params", "registry", "_source", *TRAINING_OBJECTS)
    keywords = {n for n in params if n not in script}
    assert keywords == set(CockpitSettings.model_fields)
    assert set(TRAINING_OBJECTS) <= set(params)
    for name, field in CockpitSettings.model_fields.items():
        default = params[name].default
        if name not in ("quantities", "sinks"):  # Python: a tuple; config: a list
            assert default == field.default, name


def test_every_setting_is_documented_in_the_configuration_guide():
    guide = (CORE.parent / "docs" / "configuration.md").read_text()
    missing = [n for n in CockpitSettings.model_fields if f"`{n}`" not in guide]
    assert not missing, f"docs/configuration.md does not mention {missing}"
