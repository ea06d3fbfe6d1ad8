"""Attention logit growth: a head's largest attention logit grows large, far above its start."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window
from cockpit_diagnoses._attention import (
    ATTENTION,
    Head,
    head_evidence,
    head_name,
    head_series,
    heads_text,
)
from cockpit_diagnoses._common import PersistenceConfig, fmt
from cockpit_diagnoses._units import Stretch, overlapping, reference_stretches
from cockpit_diagnoses.precedence import LOWER_LR, won_by


class AttentionLogitGrowthConfig(PersistenceConfig):
    """Options of :class:`AttentionLogitGrowth`."""

    limit: float = Field(
        100.0,
        gt=0.0,
        description="Report a head whose largest attention logit is above this (Kimi K2's "
        "QK-Clip caps it at 100).",
    )
    growth: float = Field(
        10.0,
        gt=1.0,
        description="... and at least this many times its early value (the median of its "
        "first `reference` tracked steps): logits that were large from the start are not "
        "reported.",
    )
    reference: int = Field(
        5, ge=1, description="First tracked steps whose median is a head's early value."
    )
    start: int = Field(
        10,
        ge=0,
        description="Steps before this one are not judged (the attention of freshly "
        "initialised weights moves fast).",
    )


class AttentionLogitGrowth(Diagnosis):
    """A head's largest attention logit grows above ``limit`` and ``growth`` x its early value.

    Dehghani et al. (2023, "Scaling Vision Transformers to 22 Billion Parameters", ICML)
    saw the loss of ViT-22B diverge after the attention logits ``q.k / sqrt(d)`` grew very
    large, which made the attention weights almost one-hot (near-zero entropy); Wortsman et
    al. (2023, "Small-scale proxies for large-scale Transformer training instabilities",
    Sec. 3.1.1) reproduce this attention logit growth in small models trained at high
    learning rates, and both fix it with qk-layernorm. A head is flagged at a tracked step
    when its ``max_logit`` (``attention``, cockpit-attention) is above ``limit`` (100,
    the threshold of Kimi K2's QK-Clip, Kimi Team 2025) and at least ``growth`` (10) times
    its early value, the median of its first ``reference`` (5) tracked steps; reported
    when that holds at ``fraction`` (0.8) of ``window`` (10) consecutive tracked steps from
    step ``start`` (10) on. Heads whose stretches overlap are one ``warning``. Evidence:
    per head, its early value, the median and the largest logit of its stretch.
    """

    name = "attention_logit_growth"
    reads = (ATTENTION,)
    source = (
        "Wortsman et al. (2023), Small-scale proxies, Sec. 3.1.1; Dehghani et al. (2023), "
        "ViT-22B: attention logits growing large precede divergence"
    )
    Config = AttentionLogitGrowthConfig
    config: AttentionLogitGrowthConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per group of heads whose stretches overlap."""
        cfg = self.config

        def flag(values: np.ndarray, ref: float) -> np.ndarray:
            return (values > cfg.limit) & (values >= cfg.growth * ref)

        stretches, heads = reference_stretches(
            head_series(window, "max_logit"),
            cfg.reference,
            cfg.start,
            cfg.window,
            cfg.fraction,
            flag,
        )
        found = []
        for group in overlapping(stretches):
            rows = sorted(head_evidence(group, heads, "max"), key=lambda r: -r["max"])
            found.append(self._finding(group, rows))
        return found

    def _finding(self, group: list[Stretch], rows: list[dict[str, Any]]) -> Finding:
        cfg = self.config
        top = rows[0]
        named: list[Head] = [(r["module"], r["head"]) for r in rows]
        message = (
            f"the largest attention logit of {len(rows)} head(s) grew above {fmt(cfg.limit)}: "
            f"{heads_text(named)} (the largest {fmt(top['max'])} in {head_name(named[0])}, "
            f"{times_early(top['max'], top['early'])}): their attention turns one-hot"
        )
        return self.finding(
            "",
            "warning",
            min(s.first_step for s in group),
            max(s.last_step for s in group),
            message,
            {"heads": rows, "max_logit": top["max"], "limit": cfg.limit, "growth": cfg.growth},
            "Normalize the queries and keys of the named layers (qk-layernorm: a LayerNorm on "
            "q and k before their product; Dehghani et al. 2023, Wortsman et al. 2023), lower "
            "the learning rate (of their query and key projections) or warm it up longer. "
            "Kimi K2's QK-Clip rescales the query and key weights of a head whose largest "
            "logit passes a threshold.",
            LOWER_LR,
        )


def times_early(value: float, early: float) -> str:
    """``38x its early 2.6``, or ``its early value -0.5`` when that is not positive."""
    if early > 0:
        return f"{fmt(value / early)}x its early {fmt(early)}"
    return f"its early value {fmt(early)}"
