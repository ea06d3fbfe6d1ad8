"""Shared fixtures of the core tests."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from cockpit_core import default_registry


@pytest.fixture(autouse=True, scope="session")
def _no_plugin_listing_cache():
    """Keep ``cockpit plugins`` (in-process and in subprocesses) off the user's listing cache.

    Tests monkeypatch plugins into place, which the cache's fingerprint cannot see, and must
    not write to the home folder; ``tests/core/test_plugin_listing_cache.py`` turns it back on.
    Session-wide, so that module-scoped fixtures copying ``os.environ`` see it too.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COCKPIT_NO_CACHE", "1")
        yield


@pytest.fixture
def fake_distribution(tmp_path, monkeypatch):
    """Create an installed-looking distribution with an entry point in group ``cockpit``.

    Returns a function ``make(dist_name, module_name, source, version="1.0")`` that writes
    ``module_name.py`` with ``source`` and a ``.dist-info`` folder declaring the entry
    point ``module_name = module_name``; the folder is put on ``sys.path``.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def make(dist_name: str, module_name: str, source: str, version: str = "1.0") -> Path:
        (site / f"{module_name}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist_name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
        )
        (info / "entry_points.txt").write_text(f"[cockpit]\n{module_name} = {module_name}\n")
        return site

    yield make
    for name in list(sys.modules):
        if name.startswith("fakeplug"):
            del sys.modules[name]
    # a test that built the process-wide registry with the fake plugins installed must not
    # leave them in it for later tests (e.g. `cockpit diagnose` would run their rules)
    if str(site) in sys.path:
        sys.path.remove(str(site))
    importlib.invalidate_caches()
    default_registry(refresh=True)
