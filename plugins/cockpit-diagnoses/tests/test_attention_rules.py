"""attention_logit_growth and attention_entropy_collapse on windows written by hand.

The values follow the agreed per-step form of ``attention`` (cockpit-attention):
``{"modules", "heads", "max_logit": [[per head] per layer], "entropy": [[...]], "max",
"min_entropy", "sampled"}``. The rules trained into their conditions are in
``test_attention_trained.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cockpit_diagnoses import AttentionEntropyCollapse, AttentionLogitGrowth
from cockpit_diagnoses._attention import heads_text
from pydantic import ValidationError

from cockpit_core.diagnosis import Window

LAYERS = ("model.h.0.attn", "model.h.1.attn")


def attention(max_logit, entropy, modules=LAYERS):
    """One step's value of ``attention`` in the agreed form."""
    return {
        "modules": list(modules),
        "heads": [len(row) for row in max_logit],
        "max_logit": [list(row) for row in max_logit],
        "entropy": [list(row) for row in entropy],
        "max": max(max(row) for row in max_logit),
        "min_entropy": min(min(row) for row in entropy),
        "sampled": None,
    }


def _window(logits=None, entropies=None, steps=40, heads=2):
    """``steps`` steps of two layers of ``heads`` heads: logits 2, entropy 2 nats.

    ``logits`` / ``entropies`` map ``(layer, head)`` to a function ``step -> value`` that
    replaces the default of that head.
    """
    out = {}
    for s in range(steps):
        ml = [[2.0] * heads for _ in LAYERS]
        en = [[2.0] * heads for _ in LAYERS]
        for (layer, head), f in (logits or {}).items():
            ml[layer][head] = f(s)
        for (layer, head), f in (entropies or {}).items():
            en[layer][head] = f(s)
        out[s] = {"attention": attention(ml, en)}
    return Window(out)


def grows_from(step, value, before=2.0):
    """``before`` until ``step``, ``value`` from ``step`` on."""
    return lambda s: value if s >= step else before


# -- attention_logit_growth ------------------------------------------------------------------


def test_a_head_whose_logits_grow_large_is_named_with_its_layer():
    window = _window({(1, 0): grows_from(20, 150.0)})
    (f,) = AttentionLogitGrowth().check(window)
    assert (f.id, f.severity, f.first_step, f.last_step) == (
        "attention_logit_growth@20",
        "warning",
        20,
        39,
    )
    (row,) = f.evidence["heads"]
    assert (row["module"], row["head"]) == ("model.h.1.attn", 0)
    assert (row["early"], row["median"], row["max"], row["steps_flagged"]) == (
        2.0,
        150.0,
        150.0,
        20,
    )
    assert f.evidence["max_logit"] == 150.0 and f.evidence["limit"] == 100.0
    assert "grew above 100: model.h.1.attn head 0 (the largest 150 in model.h.1.attn head 0, " in (
        f.message
    )
    assert "75x its early 2)" in f.message
    assert "qk-layernorm" in f.suggestion and f.advice == {"learning_rate": "down"}


def test_heads_whose_stretches_overlap_are_one_finding_largest_first():
    window = _window({(0, 1): grows_from(20, 120.0), (1, 0): grows_from(25, 300.0)})
    (f,) = AttentionLogitGrowth().check(window)
    assert (f.first_step, f.last_step) == (20, 39)
    assert [(r["module"], r["head"], r["max"]) for r in f.evidence["heads"]] == [
        ("model.h.1.attn", 0, 300.0),
        ("model.h.0.attn", 1, 120.0),
    ]
    assert f.evidence["heads"][1]["first_step"] == 20 and f.evidence["heads"][0]["first_step"] == 25
    assert "2 head(s)" in f.message and "model.h.1.attn head 0; model.h.0.attn head 1" in f.message


def test_stretches_that_do_not_overlap_are_findings_of_their_own():
    first = lambda s: 150.0 if 12 <= s < 24 else 2.0  # noqa: E731
    second = lambda s: 150.0 if s >= 30 else 2.0  # noqa: E731
    found = AttentionLogitGrowth().check(_window({(0, 0): first, (0, 1): second}, steps=42))
    assert [(f.first_step, f.last_step) for f in found] == [(12, 23), (30, 41)]
    assert [f.evidence["heads"][0]["head"] for f in found] == [0, 1]


def test_a_head_with_two_stretches_in_one_group_is_listed_once():
    # head 0 is above the limit at 12-23 and 30-41 (two stretches: 24-29 is too long a gap);
    # head 1's stretch 18-35 overlaps both, so the three are one finding
    logits = {
        (0, 0): lambda s: 150.0 if 12 <= s < 24 or s >= 30 else 2.0,
        (0, 1): lambda s: 110.0 if 18 <= s < 36 else 2.0,
    }
    (f,) = AttentionLogitGrowth().check(_window(logits, steps=42))
    rows = f.evidence["heads"]
    assert [(r["head"], r["first_step"], r["last_step"], r["steps_flagged"]) for r in rows] == [
        (0, 12, 41, 24),
        (1, 18, 35, 18),
    ]
    assert (f.first_step, f.last_step) == (12, 41)


def test_large_logits_need_the_growth_too():
    # 150 from the start: large, but not 10x its early value (a model that was like that)
    assert AttentionLogitGrowth().check(_window({(0, 0): lambda s: 150.0})) == []
    # grown 10x but below the limit
    assert AttentionLogitGrowth().check(_window({(0, 0): grows_from(20, 99.0, 1.0)})) == []
    (f,) = AttentionLogitGrowth(limit=50).check(_window({(0, 0): grows_from(20, 99.0, 1.0)}))
    assert f.evidence["limit"] == 50
    # 10x exactly counts (>=); 9.9x does not
    assert AttentionLogitGrowth().check(_window({(0, 0): grows_from(20, 150.0, 15.0)}))
    assert not AttentionLogitGrowth().check(_window({(0, 0): grows_from(20, 150.0, 15.2)}))


@pytest.mark.parametrize(("flagged", "found"), [(7, False), (8, True)])
def test_the_condition_must_hold_at_8_of_10_tracked_steps(flagged, found):
    hits = set(range(20, 20 + flagged))
    window = _window({(0, 0): lambda s: 150.0 if s in hits else 2.0}, steps=35)
    assert bool(AttentionLogitGrowth().check(window)) is found


def test_steps_before_start_are_not_judged_and_the_early_value_is_the_first_steps():
    window = _window({(0, 0): grows_from(2, 150.0)}, steps=20)
    assert AttentionLogitGrowth().check(window) == []  # early value 150: no growth
    window = _window({(0, 0): grows_from(5, 150.0)}, steps=20)
    (f,) = AttentionLogitGrowth().check(window)
    assert f.first_step == 10  # judged from step 10 on
    (f,) = AttentionLogitGrowth(start=0).check(window)
    assert f.first_step == 5  # the 5 reference steps themselves are never judged


def test_malformed_values_and_missing_heads_are_skipped():
    out = {s: {"attention": attention([[2.0, 2.0]], [[2.0, 2.0]], LAYERS[:1])} for s in range(40)}
    for s in range(20, 40):
        out[s]["attention"]["max_logit"][0][1] = 150.0
    out[21] = {"attention": {"modules": LAYERS[:1]}}  # no max_logit
    out[22] = {"attention": attention([[2.0, 2.0], [1.0]], [[2.0, 2.0], [1.0]])}  # a new layer
    out[23]["attention"]["max_logit"] = [[2.0, math.nan]]
    out[24] = {"attention": "not a mapping"}
    out[25]["attention"]["max_logit"] = [[2.0, "x"]]
    out[26]["attention"]["max_logit"] = [[2.0, 150.0], [1.0]]  # a row too many
    (f,) = AttentionLogitGrowth().check(Window(out))
    (row,) = f.evidence["heads"]
    # flagged: 20 and 27-39; 22 holds 2.0, the other steps are left out
    assert (row["module"], row["head"], row["steps_flagged"]) == ("model.h.0.attn", 1, 14)
    assert (f.first_step, f.last_step) == (20, 39)
    assert AttentionLogitGrowth().check(Window({})) == []
    assert not AttentionLogitGrowth().applies(Window({0: {"loss": 1.0}}))


def test_a_module_listed_twice_at_a_step_counts_once():
    calm = attention([[2.0, 2.0], [2.0, 2.0]], [[2.0, 2.0]] * 2, ["a", "a"])
    high = attention([[150.0, 2.0], [3.0, 2.0]], [[2.0, 2.0]] * 2, ["a", "a"])
    out = {s: {"attention": high if s >= 20 else calm} for s in range(40)}
    (f,) = AttentionLogitGrowth().check(Window(out))
    assert [(r["module"], r["head"], r["max"]) for r in f.evidence["heads"]] == [("a", 0, 150.0)]


def test_numpy_rows_as_the_quantity_returns_them_in_memory():
    out = {}
    for s in range(40):
        ml = np.array([[2.0, 150.0 if s >= 20 else 2.0], [2.0, 2.0]])
        out[s] = {
            "attention": {"modules": list(LAYERS), "max_logit": list(ml), "entropy": list(ml)}
        }
    (f,) = AttentionLogitGrowth().check(Window(out))
    assert f.evidence["heads"][0]["head"] == 1 and isinstance(f.evidence["heads"][0]["max"], float)


def test_logit_growth_options_are_validated():
    with pytest.raises(ValidationError, match="growth"):
        AttentionLogitGrowth(growth=1.0)
    with pytest.raises(ValidationError, match="limit"):
        AttentionLogitGrowth(limit=0)
    with pytest.raises(ValidationError, match="extra"):
        AttentionLogitGrowth(limt=50)


# -- attention_entropy_collapse --------------------------------------------------------------


def test_a_collapsed_head_is_named_and_one_head_of_two_is_info():
    window = _window(entropies={(0, 1): grows_from(15, 0.01)})
    (f,) = AttentionEntropyCollapse().check(window)
    assert (f.id, f.severity, f.first_step, f.last_step) == (
        "attention_entropy_collapse@15",
        "info",
        15,
        39,
    )
    (row,) = f.evidence["heads"]
    assert (row["module"], row["head"], row["early"], row["median"], row["min"]) == (
        "model.h.0.attn",
        1,
        2.0,
        0.01,
        0.01,
    )
    assert f.evidence["collapsed_share"] == {"model.h.0.attn": 0.5}
    assert "collapsed below 0.1 nats: model.h.0.attn head 1 (the lowest median 0.01 nats, " in (
        f.message
    )
    assert "fell to 0.005x its early 2)" in f.message
    assert "sigma-Reparam" in f.suggestion and f.advice == {"learning_rate": "down"}


def test_most_heads_of_a_layer_collapsing_is_a_warning():
    entropies = {(1, h): grows_from(15 + h, 0.001 * (h + 1)) for h in range(3)}
    (f,) = AttentionEntropyCollapse().check(_window(entropies=entropies, heads=4))
    assert f.severity == "warning" and f.evidence["collapsed_share"] == {"model.h.1.attn": 0.75}
    assert [r["head"] for r in f.evidence["heads"]] == [0, 1, 2]  # lowest median first
    assert "model.h.1.attn heads 0, 1, 2" in f.message
    (f,) = AttentionEntropyCollapse(warn_share=0.8).check(_window(entropies=entropies, heads=4))
    assert f.severity == "info"


def test_the_entropy_must_be_near_zero_and_far_below_its_early_value():
    # 0.15 nats: far below the early 2 nats, but not near zero
    assert AttentionEntropyCollapse().check(_window(entropies={(0, 0): grows_from(15, 0.15)})) == []
    assert AttentionEntropyCollapse(floor=0.2).check(
        _window(entropies={(0, 0): grows_from(15, 0.15)})
    )
    # 0.05 nats from an early 0.3: near zero, but only 1/6 of its early value
    low = _window(entropies={(0, 0): grows_from(15, 0.05, 0.3)})
    assert AttentionEntropyCollapse().check(low) == []
    assert AttentionEntropyCollapse(ratio=0.2).check(low)


def test_entropy_steps_before_start_and_short_stretches_are_not_reported():
    # collapsed from step 5, judged from step 10: 7 flagged steps by step 16, 8 by step 17
    collapsed = {(0, 0): grows_from(5, 0.01)}
    assert AttentionEntropyCollapse().check(_window(entropies=collapsed, steps=17)) == []
    (f,) = AttentionEntropyCollapse().check(_window(entropies=collapsed, steps=18))
    assert (f.first_step, f.evidence["heads"][0]["steps_flagged"]) == (10, 8)
    flicker = {(0, 0): lambda s: 0.01 if s % 2 else 2.0}  # half the steps: not persistent
    assert AttentionEntropyCollapse().check(_window(entropies=flicker)) == []


def test_entropy_options_are_validated():
    with pytest.raises(ValidationError, match="ratio"):
        AttentionEntropyCollapse(ratio=1.0)
    with pytest.raises(ValidationError, match="warn_share"):
        AttentionEntropyCollapse(warn_share=0)
    with pytest.raises(ValidationError, match="extra"):
        AttentionEntropyCollapse(flor=0.1)


def test_heads_text_groups_heads_by_module_in_order():
    heads = [("a", 3), ("b", 0), ("a", 1)]
    assert heads_text(heads) == "a heads 3, 1; b head 0"
    many = [(f"m{i}", 0) for i in range(10)]
    assert heads_text(many, most=2) == "m0 head 0; m1 head 0; ..."
