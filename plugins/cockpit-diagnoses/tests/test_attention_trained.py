"""The attention rules on a tiny nanoGPT trained into attention logit growth and collapse.

Needs the ``attention`` quantity (cockpit-attention); skipped without it. The model and
its data are in ``_lm.py``: Adam at lr 3e-3, which healthy runs keep.
"""

from __future__ import annotations

import numpy as np
import pytest
from cockpit_diagnoses import AttentionEntropyCollapse, AttentionLogitGrowth

from cockpit_core.diagnosis import Window

from ._lm import scale_queries, train_lm

pytest.importorskip("cockpit_attention", reason="needs cockpit-attention (attention)")

QK_LR = (10, {"transformer.h.1.attn.c_attn.weight": 30.0})
"""From step 10 on, the query/key/value projection of block 1 trains at 30x the lr (0.09)."""


def _head(out, module, head, field, steps):
    """``field`` of one head at ``steps``, read from the logged ``attention`` values."""
    values = []
    for s in steps:
        value = out[s]["attention"]
        layer = list(value["modules"]).index(module)
        values.append(float(np.asarray(value[field][layer], dtype=np.float64)[head]))
    return np.asarray(values)


def _stretch(out, row):
    return [s for s in range(row["first_step"], row["last_step"] + 1) if s in out]


def test_a_too_high_learning_rate_on_one_layers_queries_and_keys(tmp_path):
    out, _ = train_lm(["attention"], steps=60, jump=QK_LR)
    window = Window(out)
    assert [value["modules"] for value in (out[0]["attention"], out[59]["attention"])] == [
        ["transformer.h.0.attn", "transformer.h.1.attn"]
    ] * 2
    (growth,) = AttentionLogitGrowth().check(window)
    assert growth.severity == "warning" and 12 <= growth.first_step <= 30
    rows = growth.evidence["heads"]
    # both heads of block 1, whose projection got the learning rate; none of block 0
    assert sorted((r["module"], r["head"]) for r in rows) == [
        ("transformer.h.1.attn", 0),
        ("transformer.h.1.attn", 1),
    ]
    for row in rows:
        logged = _head(out, row["module"], row["head"], "max_logit", range(60))
        inside = logged[_stretch(out, row)]
        flagged = inside[(inside > 100) & (inside >= 10 * row["early"])]
        assert row["early"] == pytest.approx(np.median(logged[:5]), rel=1e-12)
        assert row["max"] == pytest.approx(flagged.max(), rel=1e-12)
        assert row["median"] == pytest.approx(np.median(flagged), rel=1e-12)
        assert row["steps_flagged"] == len(flagged)
    assert growth.advice == {"learning_rate": "down"}
    (collapse,) = AttentionEntropyCollapse().check(window)
    assert collapse.severity == "warning"  # every head of the layer
    assert collapse.evidence["collapsed_share"] == {"transformer.h.1.attn": 1.0}
    assert collapse.first_step <= growth.first_step  # the softmax saturates first
    for row in collapse.evidence["heads"]:
        logged = _head(out, row["module"], row["head"], "entropy", range(60))
        assert row["early"] == pytest.approx(np.median(logged[:5]), rel=1e-12)
        assert row["min"] < 0.01 < 1.0 < row["early"]


def test_the_head_whose_queries_grow_is_named():
    # from step 15 the queries of head 1 of block 0 grow 1.3x per step (its logits with them)
    out, _ = train_lm(["attention"], steps=45, hook=scale_queries(0, [1], 1.3, 15))
    window = Window(out)
    (growth,) = AttentionLogitGrowth().check(window)
    (row,) = growth.evidence["heads"]
    assert (row["module"], row["head"]) == ("transformer.h.0.attn", 1)
    logged = _head(out, "transformer.h.0.attn", 1, "max_logit", range(45))
    first = int(np.nonzero(logged > 100)[0][0])
    assert growth.first_step == first and row["max"] == pytest.approx(logged.max(), rel=1e-12)
    assert "transformer.h.0.attn head 1 (the largest" in growth.message
    (collapse,) = AttentionEntropyCollapse().check(window)
    # one head of two: info (a single head attending to one key can be healthy)
    assert collapse.severity == "info"
    assert [(r["module"], r["head"]) for r in collapse.evidence["heads"]] == [
        ("transformer.h.0.attn", 1)
    ]


def test_most_heads_of_a_layer_collapsing_is_a_warning():
    out, _ = train_lm(["attention"], steps=45, heads=4, hook=scale_queries(1, [0, 1, 2], 1.3, 15))
    (collapse,) = AttentionEntropyCollapse().check(Window(out))
    assert collapse.severity == "warning"
    assert collapse.evidence["collapsed_share"] == {"transformer.h.1.attn": 0.75}
    assert "transformer.h.1.attn heads " in collapse.message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_runs_grow_no_attention_logits_and_keep_their_entropy(seed):
    out, _ = train_lm(["attention"], steps=80, seed=seed)
    window = Window(out)
    assert AttentionLogitGrowth().check(window) == []
    assert AttentionEntropyCollapse().check(window) == []
