"""Every core module imports on its own, first (no import circle hidden by import order)."""

import subprocess
import sys

import cockpit_core

SCRIPT = r"""
import importlib, pkgutil, sys, traceback
import torch  # loaded once; only cockpit's own modules are forgotten between imports
import cockpit_core

names = [m.name for m in pkgutil.walk_packages(cockpit_core.__path__, "cockpit_core.")]
skip = ("cockpit_core.__main__",)
failed = []
for name in names:
    if name.startswith(skip):
        continue
    for loaded in [m for m in sys.modules if m.startswith(("cockpit_core", "cockpit_"))]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc(limit=2).splitlines()[-1])
print("\n".join(failed))
"""


def test_each_core_module_can_be_imported_first():
    assert cockpit_core.__path__
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", "modules that fail when imported first:\n" + out.stdout
