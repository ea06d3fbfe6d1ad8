"""``cockpit new-plugin``: generate a plugin distribution that installs, loads and passes its tests.

The files come from ``cockpit_core/cli/scaffold_templates`` (package data, shipped with
cockpit-core). Templates use two constructs: ``{{key}}`` is replaced by a value of
:func:`template_values`, and a line ``{{#flag}}`` ... ``{{/flag}}`` keeps the lines between
them only when the option ``flag`` (``instrument``, ``provider``) is on.

The repository's ``plugins/_template`` is the output of
``new_plugin("example", ..., with_instrument=True)``; a test keeps the two equal.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from cockpit_core.errors import CockpitError
from cockpit_core.plugin.discovery import core_version

TEMPLATES = Path(__file__).parent / "scaffold_templates"
"""Folder of the template files."""

_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_BLOCK = re.compile(r"^\{\{([#/])(\w+)\}\}$")


class ScaffoldError(CockpitError, ValueError):
    """``cockpit new-plugin`` cannot generate the plugin; the message says how to fix it."""


@dataclass(frozen=True)
class TemplateFile:
    """One file of the generated plugin.

    Attributes:
        template: Path of the template below :data:`TEMPLATES`.
        target: Path in the generated distribution; ``{package}`` is replaced.
        flag: The option the file needs (``"instrument"``, ``"provider"``), or ``None``.

    """

    template: str
    target: str
    flag: str | None = None


FILES: tuple[TemplateFile, ...] = (
    TemplateFile("pyproject.toml.tmpl", "pyproject.toml"),
    TemplateFile("README.md.tmpl", "README.md"),
    TemplateFile("gitignore.tmpl", ".gitignore"),
    TemplateFile("conftest.py.tmpl", "conftest.py"),
    TemplateFile("package/__init__.py.tmpl", "{package}/__init__.py"),
    TemplateFile("package/py.typed.tmpl", "{package}/py.typed"),
    TemplateFile("package/plugin.py.tmpl", "{package}/plugin.py"),
    TemplateFile("package/max_sample_grad_norm.py.tmpl", "{package}/max_sample_grad_norm.py"),
    TemplateFile("package/instruments.py.tmpl", "{package}/instruments.py", "instrument"),
    TemplateFile("package/loop_provider.py.tmpl", "{package}/loop_provider.py", "provider"),
    TemplateFile("tests/test_max_sample_grad_norm.py.tmpl", "tests/test_max_sample_grad_norm.py"),
    TemplateFile("tests/test_instruments.py.tmpl", "tests/test_instruments.py", "instrument"),
    TemplateFile("tests/test_loop_provider.py.tmpl", "tests/test_loop_provider.py", "provider"),
    TemplateFile("tests/test_plugin.py.tmpl", "tests/test_plugin.py"),
)
"""Every file a plugin can get, in the order they are written."""


@dataclass(frozen=True)
class PluginNames:
    """The names of a generated plugin, all derived from one topic.

    Attributes:
        topic: snake_case topic, e.g. ``grad_stats``; also the entry-point name.
        distribution: ``cockpit-grad-stats``: the pip name and the folder name.
        package: ``cockpit_grad_stats``: the import name.

    """

    topic: str
    distribution: str
    package: str


def plugin_names(name: str) -> PluginNames:
    """Normalize ``name`` (``Grad-Stats``, ``cockpit-grad-stats``, ``grad_stats``) to its names.

    Lower-case, ``-``/``.``/spaces become ``_``, a leading ``cockpit_`` is dropped.

    Raises:
        ScaffoldError: The result is no snake_case Python identifier (or a keyword).

    """
    topic = re.sub(r"[-.\s]+", "_", name.strip().lower())
    topic = re.sub(r"^cockpit_", "", topic)
    if not _NAME.match(topic) or keyword.iskeyword(topic) or topic == "core":
        raise ScaffoldError(
            f"{name!r} is not a valid plugin name: after normalization ({topic!r}) it must be a "
            "snake_case Python identifier that starts with a letter, e.g. 'grad_stats' or "
            "'grad-stats' (giving the distribution cockpit-grad-stats, package "
            "cockpit_grad_stats), and not 'core'."
        )
    return PluginNames(topic, "cockpit-" + topic.replace("_", "-"), "cockpit_" + topic)


def template_values(
    names: PluginNames, *, with_instrument: bool = False, with_provider: bool = False
) -> dict[str, str]:
    """The values of the ``{{key}}`` placeholders."""
    hooks = ["RegisterQuantity"]
    checked = ["quantity max_sample_grad_norm"]
    if with_instrument:
        hooks.insert(0, "RegisterInstrument")
        checked.append("instrument max_sample_grad_norm")
    if with_provider:
        hooks.append("RegisterStatisticProvider")
        checked.append(f"provider {names.topic}_loop")
    title = names.topic.replace("_", " ")
    return {
        "dist": names.distribution,
        "package": names.package,
        "entry_point": names.topic,
        "title": title,
        "Title": title[:1].upper() + title[1:],
        "summary": "the largest per-sample gradient norm",
        "provider_name": f"{names.topic}_loop",
        "core_requirement": core_requirement(),
        "hook_imports": ", ".join(hooks),
        "checked": "\n".join(f'        "{item}",' for item in checked),
    }


def core_requirement() -> str:
    """``>=MAJOR.MINOR,<NEXT_MAJOR`` of the running cockpit-core (``>=0.2,<1`` for 0.2.0)."""
    numbers = [int(part) for part in re.findall(r"\d+", core_version())[:2]]
    major, minor = (numbers + [0, 0])[:2]  # "0+unknown" from an uninstalled source tree
    return f">={major}.{minor},<{major + 1}"


def render(text: str, values: dict[str, str], flags: dict[str, bool]) -> str:
    """Fill the placeholders of ``text`` and keep the blocks whose flag is on.

    Raises:
        ScaffoldError: An unknown placeholder or flag, or an unclosed block.

    """
    out: list[str] = []
    open_blocks: list[str] = []
    for line in text.splitlines(keepends=True):
        block = _BLOCK.match(line.strip())
        if block:
            sign, flag = block.groups()
            if flag not in flags:
                raise ScaffoldError(f"unknown template flag {flag!r}")
            if sign == "#":
                open_blocks.append(flag)
            elif not open_blocks or open_blocks.pop() != flag:
                raise ScaffoldError(f"template block {flag!r} closed but not open")
            continue
        if all(flags[flag] for flag in open_blocks):
            out.append(line)
    if open_blocks:
        raise ScaffoldError(f"template block {open_blocks[-1]!r} is not closed")

    def fill(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise ScaffoldError(f"unknown template placeholder {match.group(0)}")
        return values[match.group(1)]

    return _PLACEHOLDER.sub(fill, "".join(out))


def new_plugin(
    name: str,
    directory: str | Path = ".",
    *,
    with_instrument: bool = False,
    with_provider: bool = False,
) -> Path:
    """Generate the plugin distribution ``cockpit-<name>`` in a new folder of ``directory``.

    It holds a ``pyproject.toml`` with the entry point, a package with ``plugin.py`` (the
    hooks), a quantity with a pydantic options model, optionally a dashboard panel
    (``with_instrument``) and a statistics provider (``with_provider``), tests that use the
    conformance kit (``check_quantity``, ``check_instrument``, ``check_provider``,
    ``check_plugin``) and a brute-force value test, and a README.

    Args:
        name: The plugin's name, e.g. ``grad_stats`` (see :func:`plugin_names`).
        directory: Where the folder ``cockpit-<name>`` is created.
        with_instrument: Add a dashboard panel for the quantity.
        with_provider: Add a statistics provider (a loop over samples).

    Returns:
        The folder of the new distribution.

    Raises:
        ScaffoldError: The name is invalid, the folder exists already, or a distribution of
            that name is installed.

    """
    names = plugin_names(name)
    target = Path(directory) / names.distribution
    if target.exists():
        raise ScaffoldError(
            f"{target} exists already: choose another name, or another folder with --dir."
        )
    try:
        metadata.distribution(names.distribution)
    except metadata.PackageNotFoundError:
        pass
    else:
        raise ScaffoldError(
            f"a distribution named {names.distribution} is installed already (see `pip show "
            f"{names.distribution}`): choose another name."
        )
    flags = {"instrument": with_instrument, "provider": with_provider}
    values = template_values(names, with_instrument=with_instrument, with_provider=with_provider)
    rendered = {
        file.target.format(package=names.package): render(
            (TEMPLATES / file.template).read_text(encoding="utf-8"), values, flags
        )
        for file in FILES
        if file.flag is None or flags[file.flag]
    }
    for relative, text in rendered.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as out:  # new files only: no symlink followed
            out.write(text)
    return target


def next_steps(target: Path) -> str:
    """What to do after :func:`new_plugin` (printed by ``cockpit new-plugin``)."""
    return (
        f"Created {target}. Next:\n"
        f"  cd {target}\n"
        "  python -m pip install -e .   # cockpit finds it: `cockpit plugins`\n"
        "  python -m pytest\n"
        "Walk-through: docs/writing_quantities.md of cockpit-core."
    )
