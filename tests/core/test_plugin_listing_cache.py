"""The listing cache of `cockpit plugins`: served while valid, a full load after any change."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cockpit_core import Registry
from cockpit_core.cli.main import main
from cockpit_core.plugin import discovery as plugins
from cockpit_core.plugin import listing as plugin_listing

LOCAL_PLUGIN = """
from cockpit_core import hookimpl

@hookimpl
def register_presets(register):
    register("{name}", ["loss"], "a local preset")
"""

CACHE_NOTE = "(listed from cache of "


def write_old(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with an mtime a minute ago (older than the racy window)."""
    path.write_text(textwrap.dedent(text))
    past = time.time() - 60
    os.utime(path, (past, past))
    return path


@pytest.fixture
def local_dir(tmp_path) -> Path:
    folder = tmp_path / "local"
    folder.mkdir()
    write_old(folder / "localplug.py", LOCAL_PLUGIN.format(name="local_one"))
    return folder


@pytest.fixture
def cache_env(tmp_path, local_dir, monkeypatch) -> Path:
    """The cache on, in a temporary ``XDG_CACHE_HOME``; a local plugin folder. Returns it."""
    monkeypatch.delenv(plugin_listing.NO_CACHE_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(plugins.PLUGINS_DIR_VARIABLE, str(local_dir))
    return tmp_path / "cache"


@pytest.fixture
def cli(cache_env, monkeypatch, capsys):
    """Run ``cockpit ARGS`` in-process; return ``(stdout, stderr, loaded)``.

    ``loaded``: whether the plugins were loaded (a fresh registry per load, so a changed local
    plugin shows), rather than the listing served from the cache.
    """
    from cockpit_core.plugin import registry as registry_module

    loads = []

    def registry() -> Registry:
        loads.append(1)
        for name in list(sys.modules):  # import edited plugin modules afresh
            if name.startswith(("cockpit_local_plugin_", "fakeplug")):
                del sys.modules[name]
        return Registry.from_entry_points()

    monkeypatch.setattr(registry_module, "default_registry", registry)
    monkeypatch.setattr(plugin_listing, "RACY_SECONDS", 0.0)  # other tests' files are fresh

    def run(*args: str) -> tuple[str, str, bool]:
        importlib.invalidate_caches()  # a fresh process sees new files; so must this one
        capsys.readouterr()
        before = len(loads)
        assert main(list(args)) == 0
        captured = capsys.readouterr()
        return captured.out, captured.err, len(loads) > before

    return run


@pytest.mark.parametrize("args", [["plugins"], ["plugins", "-v"], ["plugins", "--json"]])
def test_the_second_listing_comes_from_the_cache_with_the_same_output(cli, args):
    out, err, loaded = cli(*args)
    assert loaded and CACHE_NOTE not in err
    assert "local_one" in out
    again, err_again, loaded_again = cli(*args)
    assert not loaded_again
    assert again == out
    if "-v" in args:
        assert err_again.startswith(CACHE_NOTE) and "--refresh re-imports the plugins" in err_again
    else:
        assert CACHE_NOTE not in err_again


def test_json_from_the_cache_equals_a_full_load(cli):
    full, _, _ = cli("plugins", "--refresh", "--json")
    cached, _, loaded = cli("plugins", "--json")
    assert not loaded and json.loads(cached) == json.loads(full)
    names = [row["name"] for row in json.loads(cached)]
    assert "basic" in names and "localplug" in names


def test_refresh_loads_the_plugins_and_rewrites_the_cache(cli, cache_env):
    cli("plugins")
    (path,) = (cache_env / "cockpit").iterdir()
    written = json.loads(path.read_text())["entries"][0]["created"]
    _, _, loaded = cli("plugins", "--refresh")
    assert loaded
    assert json.loads(path.read_text())["entries"][0]["created"] > written
    assert not cli("plugins")[2]


def test_a_changed_local_plugin_file_is_loaded_again(cli, local_dir):
    cli("plugins")
    assert not cli("plugins")[2]
    write_old(local_dir / "localplug.py", LOCAL_PLUGIN.format(name="local_second"))
    out, _, loaded = cli("plugins")
    assert loaded and "presets: local_second" in out
    path = local_dir / "localplug.py"
    later = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(later, later))  # touched: same size, new mtime
    assert cli("plugins")[2]
    assert not cli("plugins")[2]


def test_a_new_local_plugin_file_is_loaded(cli, local_dir):
    cli("plugins")
    write_old(local_dir / "another.py", LOCAL_PLUGIN.format(name="another_one"))
    out, _, loaded = cli("plugins")
    assert loaded and "presets: another_one" in out


def test_another_plugin_folder_is_loaded_and_both_stay_cached(cli, tmp_path, monkeypatch):
    first, _, _ = cli("plugins")
    other = tmp_path / "other"
    other.mkdir()
    write_old(other / "otherplug.py", LOCAL_PLUGIN.format(name="other_one"))
    monkeypatch.setenv(plugins.PLUGINS_DIR_VARIABLE, str(other))
    out, _, loaded = cli("plugins")
    assert loaded and "other_one" in out and "local_one" not in out
    monkeypatch.setenv(plugins.PLUGINS_DIR_VARIABLE, str(tmp_path / "local"))
    again, _, loaded = cli("plugins")
    assert not loaded and again == first


def test_an_installed_distribution_invalidates_the_cache(cli, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    cli("plugins")
    assert not cli("plugins")[2]
    info = site / "unrelated_dist-1.0.dist-info"  # no cockpit entry point: still counts
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unrelated-dist\nVersion: 1.0\n")
    assert cli("plugins")[2]
    assert not cli("plugins")[2]
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unrelated-dist\nVersion: 1.1\n")
    assert cli("plugins")[2]


def test_an_edited_entry_point_module_invalidates_the_cache(cli, fake_distribution):
    site = fake_distribution("fakeplug-cached", "fakeplug_cached", LOCAL_PLUGIN.format(name="a"))
    module = site / "fakeplug_cached.py"
    os.utime(module, (time.time() - 60, time.time() - 60))
    out, _, _ = cli("plugins")
    assert "fakeplug_cached  (fakeplug-cached 1.0)  ok" in out
    assert not cli("plugins")[2]
    write_old(module, "import does_not_exist_anywhere\n")
    out, _, loaded = cli("plugins")
    assert loaded and "fakeplug_cached  (fakeplug-cached 1.0)  SKIPPED: import failed" in out


@pytest.mark.parametrize(
    "garbage", ["", "{not json", '{"format": 1, "entries": 3}', '{"format": 1, "entries": [7]}']
)
def test_a_corrupt_cache_file_means_a_full_load_and_is_replaced(cli, cache_env, garbage):
    first, _, _ = cli("plugins")
    (path,) = (cache_env / "cockpit").iterdir()
    path.write_text(garbage)
    out, _, loaded = cli("plugins")
    assert loaded and out == first
    assert not cli("plugins")[2]


def test_a_corrupt_entry_means_a_full_load(cli, cache_env):
    cli("plugins")
    (path,) = (cache_env / "cockpit").iterdir()
    data = json.loads(path.read_text())
    data["entries"][0]["listing"]["rows"] = "rows"
    path.write_text(json.dumps(data))
    assert cli("plugins")[2]


def test_no_cache_variable_neither_reads_nor_writes(cli, cache_env, monkeypatch):
    monkeypatch.setenv(plugin_listing.NO_CACHE_VARIABLE, "1")
    assert cli("plugins")[2] and cli("plugins")[2]
    assert not cache_env.exists()
    monkeypatch.setenv(plugin_listing.NO_CACHE_VARIABLE, "0")  # 0: the cache is on
    cli("plugins")
    assert not cli("plugins")[2]


def test_an_unwritable_cache_folder_is_ignored(cli, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # cockpit/ cannot be created in it
    out, err, loaded = cli("plugins")
    assert loaded and "basic  (cockpit-basic" in out and err == ""
    assert cli("plugins")[2]


def test_a_failing_fingerprint_means_a_full_load_and_no_cache(cli, cache_env, monkeypatch):
    def broken() -> dict:
        raise OSError("cannot stat")

    monkeypatch.setattr(plugin_listing, "fingerprint_inputs", broken)
    assert cli("plugins")[2] and cli("plugins")[2]
    assert not cache_env.exists()


def test_a_file_changed_just_now_is_not_cached(cli, local_dir, monkeypatch):
    monkeypatch.setattr(plugin_listing, "RACY_SECONDS", 2.0)
    (local_dir / "localplug.py").write_text(LOCAL_PLUGIN.format(name="fresh"))
    assert cli("plugins")[2]
    assert cli("plugins")[2]  # an edit within the timestamp granularity could go unseen
    os.utime(local_dir / "localplug.py", (time.time() - 60, time.time() - 60))
    cli("plugins")
    assert not cli("plugins")[2]


def test_warnings_of_the_load_are_shown_again_from_the_cache(cli, local_dir):
    write_old(
        local_dir / "badpanels.py",
        """
        from cockpit_core import hookimpl

        @hookimpl
        def register_instruments(register):
            raise RuntimeError("no panels today")
        """,
    )
    with pytest.warns(UserWarning, match="no panels today"):
        out, _, _ = cli("plugins")
    again, err, loaded = cli("plugins")
    assert not loaded and again == out
    assert "PANELS/SINKS SKIPPED 'badpanels'" in out
    assert "UserWarning: cockpit: plugin 'badpanels'" in err and "no panels today" in err


def test_the_fingerprint_covers_editable_plugins_the_core_and_local_files(cache_env, local_dir):
    import cockpit_basic

    inputs = plugin_listing.fingerprint_inputs()
    files = {entry[0] for entry in inputs["files"]}
    assert str(Path(cockpit_basic.__file__).with_name("plugin.py")) in files
    assert str(Path(plugin_listing.__file__).resolve()) in files
    assert str(local_dir / "localplug.py") in files
    assert not any("__pycache__" in name for name in files)
    assert ["cockpit-core", inputs["core"]] in inputs["distributions"]
    assert ["basic", "cockpit_basic.plugin", "cockpit-basic"] in inputs["entry_points"]
    assert inputs["plugins_dir"] == [str(local_dir), [[str(local_dir), True]]]


def test_the_plugins_dir_variable_is_the_one_discovery_reads():
    assert plugin_listing.PLUGINS_DIR_VARIABLE == plugins.PLUGINS_DIR_VARIABLE


PROBE = """
import sys
from cockpit_core.cli.main import main
code = main(sys.argv[1:])
sys.stdout.flush()
loaded = sorted(m for m in ("torch", "cockpit_basic", "pluggy") if m in sys.modules)
print("imported:", ",".join(loaded) or "-", file=sys.stderr)
sys.exit(code)
"""


def test_a_cached_listing_imports_neither_torch_nor_plugins(cache_env, local_dir, tmp_path):
    env = dict(os.environ)

    def cockpit(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    full = cockpit("plugins", "-v", "--refresh")
    assert "imported: cockpit_basic,pluggy,torch" in full.stderr
    assert CACHE_NOTE not in full.stderr
    cached = cockpit("plugins", "-v")
    assert cached.stdout == full.stdout
    assert cached.stderr.startswith(CACHE_NOTE)
    assert cached.stderr.endswith("imported: -\n")
    write_old(local_dir / "localplug.py", LOCAL_PLUGIN.format(name="edited"))
    edited = cockpit("plugins", "-v")
    assert "presets: edited" in edited.stdout and "imported: cockpit_basic" in edited.stderr
