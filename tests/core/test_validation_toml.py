"""Python 3.10 has no ``tomllib``: the config loader falls back to ``tomli``, or says how to fix it.

Each test executes ``cockpit_core/config/files.py`` afresh as a separate module while ``tomllib``
is hidden (``sys.modules["tomllib"] = None`` makes ``import tomllib`` fail as on 3.10), so
the package's own ``cockpit_core.config.files`` stays untouched. The tests use the real ``tomli``
where it is installed (cockpit-core depends on it below Python 3.11, where the last test
checks that it is the parser in use); on 3.11+ it usually is not, and a stand-in module with
tomli's API (the one ``tomllib`` was made from) that delegates to ``tomllib`` plays it.
"""

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

import cockpit_core.config.files
from cockpit_core import ConfigError

try:
    import tomllib as real_toml
except ImportError:  # Python 3.10
    real_toml = None

TOML = 'on_error = "disable"\nquantities = ["loss", { name = "grad_norm", every = 5 }]\n'


def _tomli():
    try:
        import tomli
    except ImportError:
        if real_toml is None:
            pytest.skip("Python 3.10 without tomli: install it (pip install tomli)")
        tomli = types.ModuleType("tomli")  # a stand-in with tomli's API
        tomli.loads = real_toml.loads
        tomli.TOMLDecodeError = real_toml.TOMLDecodeError
    return tomli


def _config_module_without_tomllib(monkeypatch, tomli):
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", tomli)
    name = "cockpit_config_without_tomllib"
    spec = importlib.util.spec_from_file_location(name, cockpit_core.config.files.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # pydantic resolves annotations through it
    spec.loader.exec_module(module)
    return module


def test_hiding_tomllib_makes_its_import_fail(monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)
    with pytest.raises(ImportError):
        import tomllib  # noqa: F401 - only the import is tested


def test_without_tomllib_a_toml_file_loads_with_tomli(monkeypatch, tmp_path):
    tomli = _tomli()
    config = _config_module_without_tomllib(monkeypatch, tomli)
    assert config._toml is tomli
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    assert config.load_config_file(path) == {
        "on_error": "disable",
        "quantities": ["loss", {"name": "grad_norm", "every": 5}],
    }
    path.write_text("quantities = [")
    with pytest.raises(ConfigError, match="cannot parse"):
        config.load_config_file(path)


def test_without_tomllib_and_tomli_the_message_names_pip_install_tomli(monkeypatch, tmp_path):
    config = _config_module_without_tomllib(monkeypatch, None)
    assert config._toml is None
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    with pytest.raises(ConfigError) as err:
        config.load_config_file(path)
    assert err.value.errors == [
        (
            "",
            "reading a .toml file needs Python 3.11+ or the 'tomli' package: run "
            "`pip install tomli`, or write the config as .yaml or .json",
        )
    ]
    assert str(err.value).startswith(f"Invalid cockpit configuration in {path}:")
    (tmp_path / "c.json").write_text(json.dumps({"quantities": ["loss"]}))
    (tmp_path / "c.yaml").write_text("quantities: [loss]\n")
    assert config.load_config_file(tmp_path / "c.json") == {"quantities": ["loss"]}
    assert config.load_config_file(tmp_path / "c.yaml") == {"quantities": ["loss"]}


def test_tomli_is_a_dependency_below_python_3_11():
    pyproject = cockpit_core.config.files.load_config_file(
        Path(cockpit_core.config.files.__file__).parents[2] / "pyproject.toml"
    )
    assert "tomli>=2; python_version < '3.11'" in pyproject["project"]["dependencies"]


@pytest.mark.skipif(sys.version_info >= (3, 11), reason="Python 3.11+ reads TOML with tomllib")
def test_below_python_3_11_the_real_tomli_is_installed_and_used():
    import tomli

    assert cockpit_core.config.files._toml is tomli
