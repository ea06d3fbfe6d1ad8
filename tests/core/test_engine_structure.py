"""The engine's shape: one owner per piece of state, settings declared once.

These tests read the source (``ast``) rather than run it, so a refactoring that reaches into
another module's private attributes fails here, with the place. Import circles, anywhere in
the core and the plugins, are ``test_import_structure.py``'s.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import cockpit_core
from cockpit_core import Cockpit
from cockpit_core.cockpit import TRAINING_OBJECTS
from cockpit_core.config_settings import CockpitSettings

CORE = Path(cockpit_core.__file__).parent
ENGINE = (
    "cockpit",
    "tracker",
    "step",
    "planner",
    "state",
    "error_policy",
    "accumulation",
    "context",
    "step_data",
    "hvp",
    "cache",
    "registry",
    "registry_entries",
    "name_table",
)


def _private_reads(path: Path) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` (dunders and ``_fields`` aside)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        root = owner
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in ("sys", "torch"):
            continue  # sys._getframe, torch.nn.modules.batchnorm._BatchNorm: library names
        if attr == "_version":
            continue  # a tensor's version counter, read to see in-place changes
        found.append(f"{path.name}:{node.lineno}: .{attr}")
    return found


def test_no_engine_module_reads_another_objects_private_attributes():
    problems = [p for m in ENGINE for p in _private_reads(CORE / f"{m}.py")]
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
