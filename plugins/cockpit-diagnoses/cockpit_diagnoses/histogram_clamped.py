"""Histogram clamped: much of the gradient histogram's mass sits in its two edge bins."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window, persistent_spans
from cockpit_diagnoses._common import PersistenceConfig, fmt


class HistogramClampedConfig(PersistenceConfig):
    """Options of :class:`HistogramClamped`."""

    max_share: float = Field(
        0.01,
        gt=0.0,
        lt=1.0,
        description="Report when the edge bins hold more than this share of the counts.",
    )


class HistogramClamped(Diagnosis):
    """The ``grad_hist_1d`` range is too narrow: values outside it pile up in the edge bins.

    ``grad_hist_1d`` (cockpit-histograms) clamps a value outside its ``range`` into the
    first or last bin (as ``torch.histc``; see ``docs/quantities/histograms.md``), so the
    edge bins' share ``(h_0 + h_last) / sum_i h_i`` is the share of gradient elements the
    histogram cannot place. A tracked step is flagged when it exceeds ``max_share`` (1 %),
    reported at ``fraction`` (0.8) of ``window`` (10) consecutive tracked steps (severity
    ``info``: the training is fine, its picture is not). Evidence: the median share, the
    range, the largest ``|g|`` of the stretch.
    """

    name = "histogram_clamped"
    reads = ("grad_hist_1d",)
    source = "rule: edge-bin share of grad_hist_1d (values outside the range are clamped)"
    Config = HistogramClampedConfig
    config: HistogramClampedConfig

    def check(self, window: Window) -> list[Finding]:
        """Return the stretches where the edge bins hold too much of the histogram."""
        cfg = self.config
        steps, share, ranges, abs_max = [], [], [], []
        for step, value in window.values("grad_hist_1d"):
            hist = np.asarray(value.get("hist", ()), dtype=np.float64).reshape(-1)
            edges = np.asarray(value.get("edges", ()), dtype=np.float64).reshape(-1)
            total = hist.sum() if len(hist) >= 2 else 0.0
            if not total > 0 or len(edges) < 2:
                continue
            steps.append(step)
            share.append((hist[0] + hist[-1]) / total)
            ranges.append((float(edges[0]), float(edges[-1])))
            abs_max.append(float(value.get("grad_abs_max", np.nan)))
        steps_a, share_a = np.asarray(steps), np.asarray(share)
        found = []
        spans = persistent_spans(steps_a, share_a > cfg.max_share, cfg.window, cfg.fraction)
        for first, last, count in spans:
            inside = (steps_a >= first) & (steps_a <= last)
            median = float(np.median(share_a[inside]))
            low, high = ranges[int(np.nonzero(steps_a == last)[0][0])]
            largest = float(np.nanmax(np.asarray(abs_max)[inside]))
            found.append(
                self.finding(
                    "",
                    "info",
                    first,
                    last,
                    f"{fmt(100 * median)} % of the gradient elements fall outside the "
                    f"histogram's range [{fmt(low)}, {fmt(high)}] and are clamped into its "
                    "edge bins",
                    {
                        "median_edge_share": median,
                        "max_share": cfg.max_share,
                        "range": [low, high],
                        "grad_abs_max": largest,
                        "steps_flagged": count,
                    },
                    f"Widen grad_hist_1d's range (e.g. to +-{fmt(largest)}) or set its adapt "
                    "option (docs/quantities/histograms.md).",
                )
            )
        return found
