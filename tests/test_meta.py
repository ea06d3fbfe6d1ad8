"""Meta-tests: every hook spec is documented with its exact signature and has a test."""

import inspect
import re
from pathlib import Path

import pytest

from cockpit_core.hookspecs import HOOK_NAMES, hook_signatures

ROOT = Path(__file__).resolve().parents[1]


def documented_headings() -> str:
    return "\n".join(
        line
        for doc in [ROOT / "docs" / "hooks.md"]
        for line in doc.read_text().splitlines()
        if line.startswith("#")
    )


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_every_hook_is_documented_with_its_exact_signature(name):
    spec = hook_signatures()[name]
    signature = f"{name}{inspect.signature(spec)}".replace("'", "")
    assert signature in documented_headings().replace("'", ""), (
        f"docs/hooks.md needs a heading with the exact signature `{signature}`"
    )


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_every_hook_has_a_test(name):
    pattern = re.compile(rf"def test_hook_{name}\b")
    sources = [p.read_text() for p in (ROOT / "tests").rglob("test_*.py")]
    assert any(pattern.search(s) for s in sources), f"add a test named test_hook_{name}"


def test_hook_names_match_the_specs_module():
    import cockpit_core.hookspecs as specs

    marked = {n for n, f in vars(specs).items() if callable(f) and hasattr(f, "cockpit_spec")}
    assert marked == set(HOOK_NAMES)
