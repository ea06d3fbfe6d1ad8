"""Attention entropy collapse: a head's attention entropy falls to near zero."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window
from cockpit_diagnoses._attention import ATTENTION, Head, head_evidence, head_series, heads_text
from cockpit_diagnoses._common import PersistenceConfig, change_factor, fmt
from cockpit_diagnoses._units import Stretch, overlapping, reference_stretches
from cockpit_diagnoses.precedence import LOWER_LR, won_by


class AttentionEntropyCollapseConfig(PersistenceConfig):
    """Options of :class:`AttentionEntropyCollapse`."""

    floor: float = Field(
        0.1,
        gt=0.0,
        description="Report a head whose attention entropy is below this many nats (0.1: "
        "about 98 % of the weight on one key) ...",
    )
    ratio: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="... and below this share of its early value (the median of its first "
        "`reference` tracked steps).",
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
    warn_share: float = Field(
        0.75,
        gt=0.0,
        le=1.0,
        description="Warn when at least this share of one layer's heads collapse over "
        "overlapping stretches; fewer heads are info (one head that attends to a single key, "
        "an attention sink or the previous token, can be healthy).",
    )


class AttentionEntropyCollapse(Diagnosis):
    """A head's attention entropy falls below ``floor`` nats and ``ratio`` x its early value.

    Zhai et al. (2023, "Stabilizing Transformer Training by Preventing Attention Entropy
    Collapse", ICML) find that unstable Transformer runs (loss oscillation or divergence)
    come with attention entropy collapse: the entropy of the attention distributions falls
    to near zero, each query puts its weight on one key; they keep it up with sigma-Reparam
    (linear layers reparametrized by their spectral norm). A head is flagged at a tracked
    step when its ``entropy`` (``attention``, cockpit-attention: the mean over batch and
    queries, in nats) is below ``floor`` (0.1 nats) and below ``ratio`` (0.1) times its
    early value, the median of its first ``reference`` (5) tracked steps; reported when that
    holds at ``fraction`` (0.8) of ``window`` (10) consecutive tracked steps from step
    ``start`` (10) on. Heads whose stretches overlap are one finding: ``warning`` when they
    include at least ``warn_share`` (3/4) of one layer's heads, else ``info``. Evidence: per
    head, its early value, the median and the lowest entropy of its stretch; per layer, the
    share of its heads that collapsed.
    """

    name = "attention_entropy_collapse"
    reads = (ATTENTION,)
    source = (
        "Zhai et al. (2023), Stabilizing Transformer Training by Preventing Attention Entropy "
        "Collapse, ICML"
    )
    Config = AttentionEntropyCollapseConfig
    config: AttentionEntropyCollapseConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per group of heads whose stretches overlap."""
        cfg = self.config

        def flag(values: np.ndarray, ref: float) -> np.ndarray:
            return (values < cfg.floor) & (values < cfg.ratio * ref)

        series = head_series(window, "entropy")
        stretches, heads = reference_stretches(
            series, cfg.reference, cfg.start, cfg.window, cfg.fraction, flag
        )
        per_layer: dict[str, int] = {}
        for module, _ in series:
            per_layer[module] = per_layer.get(module, 0) + 1
        found = []
        for group in overlapping(stretches):
            rows = sorted(head_evidence(group, heads, "min"), key=lambda r: r["median"])
            found.append(self._finding(group, rows, _layer_shares(group, per_layer)))
        return found

    def _finding(
        self, group: list[Stretch], rows: list[dict[str, Any]], share: dict[str, float]
    ) -> Finding:
        cfg = self.config
        named: list[Head] = [(r["module"], r["head"]) for r in rows]
        lowest = rows[0]
        severity = "warning" if max(share.values()) >= cfg.warn_share else "info"
        message = (
            f"the attention entropy of {len(rows)} head(s) collapsed below {fmt(cfg.floor)} "
            f"nats: {heads_text(named)} (the lowest median {fmt(lowest['median'])} nats, "
            f"{change_factor(lowest['early'], lowest['median'])} its early "
            f"{fmt(lowest['early'])}): each query attends to about one key"
        )
        return self.finding(
            "",
            severity,
            min(s.first_step for s in group),
            max(s.last_step for s in group),
            message,
            {
                "heads": rows,
                "collapsed_share": share,
                "floor": cfg.floor,
                "ratio": cfg.ratio,
                "warn_share": cfg.warn_share,
            },
            "Lower the learning rate or warm it up longer; normalize the queries and keys "
            "(qk-layernorm) or reparametrize the linear layers by their spectral norm "
            "(sigma-Reparam, Zhai et al. 2023). A single head that attends to one key by "
            "design (an attention sink, the previous token) may be healthy: read it with "
            "the loss.",
            LOWER_LR,
        )


def _layer_shares(group: list[Stretch], heads_per_layer: dict[str, int]) -> dict[str, float]:
    """Per layer with a head in ``group``: the share of its heads in the group."""
    collapsed: dict[str, set[int]] = {}
    for s in group:
        collapsed.setdefault(s.unit[0], set()).add(s.unit[1])
    return {m: len(hs) / heads_per_layer[m] for m, hs in collapsed.items()}
