"""The package's public names load on first use: ``import cockpit_core`` imports no torch."""

import ast
import subprocess
import sys
from pathlib import Path

import cockpit_core


def test_importing_the_package_imports_no_torch():
    code = "import sys, cockpit_core, cockpit_core.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_public_name_resolves_and_type_checkers_see_the_same_names():
    for name in cockpit_core.__all__:
        assert getattr(cockpit_core, name) is not None
    tree = ast.parse(Path(cockpit_core.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If))  # `if TYPE_CHECKING:`
    seen = {a.name for node in guarded.body for a in node.names}
    assert seen == set(cockpit_core._EXPORTS)
    assert set(cockpit_core.__all__) == {*cockpit_core._EXPORTS, "__version__"}
