"""style.line lets keyword arguments win; cockpit_core's namespace; py.typed is shipped."""

import types
from pathlib import Path

import numpy as np
import pytest

import cockpit_core
from cockpit_core.panel.style import PRIMARY, line


def _axes():
    from matplotlib.figure import Figure

    return Figure().add_subplot()


@pytest.mark.parametrize("kwargs", [{"linewidth": 2}, {"lw": 2}])
def test_line_width_keywords_win(kwargs):
    ax = _axes()
    line(ax, np.arange(3), np.ones(3), **kwargs)
    assert ax.lines[0].get_linewidth() == 2


def test_line_default_width_and_other_keywords():
    ax = _axes()
    line(ax, np.arange(3), np.array([1.0, np.nan, 2.0]), ls="--", alpha=0.5)
    drawn, marks = ax.lines
    assert (drawn.get_linewidth(), drawn.get_linestyle(), drawn.get_alpha()) == (1.3, "--", 0.5)
    assert drawn.get_color() == PRIMARY
    assert marks.get_label() == "NaN/inf"


def test_line_with_both_width_aliases_is_matplotlibs_error():
    with pytest.raises(TypeError, match="Got both 'linewidth' and 'lw'"):
        line(_axes(), np.arange(3), np.ones(3), linewidth=2, lw=3)


def test_namespace_has_no_accidental_exports():
    public = {
        name
        for name in dir(cockpit_core)
        if not name.startswith("_")
        and not isinstance(getattr(cockpit_core, name), types.ModuleType)
    }
    assert public == set(cockpit_core.__all__) - {"__version__"}
    for accidental in ("PackageNotFoundError", "version", "metadata", "Any"):
        assert not hasattr(cockpit_core, accidental)
    assert isinstance(cockpit_core.__version__, str)


def test_py_typed_marker_is_shipped():
    assert (Path(cockpit_core.__file__).parent / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["cockpit_core"]
