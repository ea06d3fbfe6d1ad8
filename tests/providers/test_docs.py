"""docs/providers.md stays true: its examples are the tested plugins, its tables the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cockpit_core.statistics.kinds import BUILTIN_KINDS
from cockpit_core.testing import tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients

from ._common import model_with, registry_with, train
from .l1_kind import BATCH_L1

HERE = Path(__file__).resolve().parent
DOC = (HERE.parents[1] / "docs" / "providers.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC, flags=re.DOTALL)


def test_the_complete_provider_is_the_tested_loop_provider():
    assert (HERE / "loop_provider.py").read_text() in python_blocks()


def test_the_kind_example_is_the_tested_l1_kind_plugin():
    assert (HERE / "l1_kind.py").read_text() in python_blocks()


def table_rows(first_column: str) -> dict[str, list[str]]:
    """Rows of the markdown table whose header starts with ``| first_column |``."""
    start = DOC.index(f"| {first_column} |")
    rows = {}
    for line in DOC[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_kinds_table_lists_every_builtin_kind_with_its_rules():
    rows = table_rows("kind")
    assert set(rows) == set(BUILTIN_KINDS)
    for name, kind in BUILTIN_KINDS.items():
        per_sample, combine = rows[name][0], rows[name][1].strip("`")
        assert per_sample == ("yes" if kind.per_sample else "no"), name
        assert combine == str(kind.combine), name


def test_the_providers_table_matches_the_installed_providers():
    rows = table_rows("provider")
    registry = registry_with()
    assert {"func", "loop"} <= set(registry.providers)
    for name, (distribution, cost, *_) in rows.items():
        if name not in registry.providers:  # e.g. cockpit-backpack not installed
            continue
        entry = registry.providers[name]
        assert entry.distribution == distribution.strip("`"), name
        assert float(cost) == entry.cls.cost, name


def test_the_quantity_using_the_new_kind_runs():
    (block,) = [b for b in python_blocks() if "class MaxSampleL1" in b]
    namespace = {"BATCH_L1": BATCH_L1}
    exec(block, namespace)
    problem = tiny_mlp()
    cp, _, batches = train(
        problem, [namespace["MaxSampleL1"]()], registry_with(), steps=1, backend="func"
    )
    x, y, params = batches[0]
    grads = per_sample_gradients(model_with(problem, params), problem, x, y)
    expected = sum(g.flatten(1).abs().sum(1) for g in grads).max()
    assert cp.get_output()[0]["max_sample_l1"] == pytest.approx(float(expected), rel=1e-10)
