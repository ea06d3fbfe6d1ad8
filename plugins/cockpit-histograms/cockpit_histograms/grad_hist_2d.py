"""Joint histogram of per-sample gradient elements and parameter values."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, field_validator
from torch import Tensor

from cockpit_core import (
    OuterProductGrads,
    PerSampleGrads,
    PooledGrads,
    Quantity,
    QuantityConfig,
    Requirements,
    ResumeContext,
    Statistic,
    StepContext,
    per_sample_transform,
)
from cockpit_histograms._binning import (
    EXTRA_2D,
    MAX_BINS_2D,
    RangeAdaptation,
    check_layers,
    check_range,
    hist2d_layer,
    stack_layers,
)
from cockpit_histograms._factored2d import hist2d_factored
from cockpit_histograms._pooled import hist2d_pool

Range = tuple[float, float]


class GradHist2dConfig(QuantityConfig):
    """Options of :class:`GradHist2d` (defaults as Cockpit 1.0.2's ``GradHist2d``)."""

    bins: tuple[int, int] = Field(
        (40, 50), description="Number of bins (gradient axis x, parameter axis y)."
    )
    range: tuple[Range, Range] = Field(
        ((-1.0, 1.0), (-2.0, 2.0)),
        description="Bin ranges ((x_low, x_high), (y_low, y_high)) of the gradient and the "
        "parameter axis; values outside are counted in the edge bins.",
    )
    adapt: tuple[RangeAdaptation | None, RangeAdaptation | None] = Field(
        (None, None),
        description="Range adaptation of the x and the y axis, each None (fixed), "
        "'grad_abs_max', 'param_abs_max' or {kind, padding, min_size}.",
    )
    keep_individual: bool = Field(
        False, description="Also return each parameter's histogram ('per_param')."
    )

    @field_validator("bins")
    @classmethod
    def _valid_bins(cls, value: tuple[int, int]) -> tuple[int, int]:
        if min(value) < 1 or value[0] * value[1] > MAX_BINS_2D:
            raise ValueError(
                f"bins must be two positive integers with at most {MAX_BINS_2D} bins in "
                f"all, got {value}; e.g. bins = [40, 50]."
            )
        return value

    @field_validator("range")
    @classmethod
    def _valid_range(cls, value: tuple[Range, Range]) -> tuple[Range, Range]:
        return (check_range(value[0], "range[0] (x)"), check_range(value[1], "range[1] (y)"))


class GradHist2d(Quantity):
    """2-D histogram of (per-sample gradient element, parameter element) pairs.

    Counts each pair ``([g_n]_i, theta_i)`` for all samples ``n`` and parameter elements
    ``i`` (``g_n = grad l_n``, as Cockpit 1.0.2 which bins ``B * grad_batch``), with the
    gradient on the x axis and the parameter on the y axis. As in Cockpit, values are
    clamped to the centres of the edge bins and quantized in float32 as
    ``floor((v - low) / width)``; pairs with a non-finite value are counted apart.

    Counts are computed per layer during backpropagation (quantize + ``bincount``, the
    parameter's bin index computed once and broadcast over the batch) and the layer's
    per-sample gradients are freed right after. For linear layers (BackPACK backend) the
    per-sample gradients ``g_n = d_n a_n^T`` are not formed: products with a zero factor
    are counted from the zero masks and the others formed in small blocks, with the same
    counts. Small parameters with the same number of elements are binned together
    (``pooled_fn``), with the same counts. Range adaptation works as for
    :class:`~cockpit_histograms.GradHist1d`: the maxima seen at a tracked step set the
    ranges of the next tracked step.

    Reference: Schneider, Dangel & Hennig, "Cockpit: A Practical Debugging Tool for the
    Training of Deep Neural Networks", NeurIPS 2021.
    """

    name = "grad_hist_2d"
    Config = GradHist2dConfig
    config: GradHist2dConfig

    def __init__(self, config: Any = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        self._range: tuple[Range, Range] = tuple(tuple(r) for r in self.config.range)  # type: ignore[assignment]

    @property
    def current_range(self) -> tuple[Range, Range]:
        """The ranges the next tracked step bins into."""
        return self._range

    def state_dict(self) -> dict[str, Any]:
        """The ranges of the next tracked step (adapted with ``adapt``)."""
        return {"range": [[float(v) for v in r] for r in self._range]}

    def load_state_dict(self, state: dict[str, Any], ctx: ResumeContext) -> None:
        """Bin into the saved run's next ranges."""
        if "range" in state:
            (xlo, xhi), (ylo, yhi) = ((float(a), float(b)) for a, b in state["range"])
            self._range = ((xlo, xhi), (ylo, yhi))

    def _statistic(self) -> Statistic:
        xbins, ybins = self.config.bins
        if self.config.adapt == (None, None):
            (xlo, xhi), (ylo, yhi) = self._range
            key = (
                f"grad_hist_2d(bins=({xbins},{ybins}),range=(({xlo!r},{xhi!r}),({ylo!r},{yhi!r})))"
            )
        else:  # the ranges change from step to step: this instance's own statistic
            key = f"grad_hist_2d[{self.key}](bins=({xbins},{ybins}),adaptive)"
        # counts add up across processes; the last two entries (max |g|, |theta|) are maxima
        return per_sample_transform(
            key,
            self._transform,
            reduce="sum",
            max_last=2,
            factored_fn=self._factored,
            pooled_fn=self._pooled,
        )

    def requirements(self) -> Requirements:
        """One per-sample transform whose key encodes the bins and the ranges."""
        return Requirements(statistics=(self._statistic(),))

    # A failing transform never breaks backward(): the core records the error and
    # ctx.stat then raises it in compute().
    def _transform(self, per_sample: Tensor, param: Tensor) -> Tensor:
        return hist2d_layer(per_sample, param, self._range, self.config.bins)

    def _factored(self, grads: PerSampleGrads, param: Tensor) -> Any:
        if isinstance(grads, OuterProductGrads) and not grads.has_sequence:
            return hist2d_factored(grads.d, grads.a, param, self._range, self.config.bins)
        return NotImplemented  # e.g. convolutions: the core bins blocks of samples with fn

    def _pooled(self, pool: PooledGrads) -> Tensor:
        return hist2d_pool(pool.grads, pool.params, self._range, self.config.bins)

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return the histogram (see ``docs/quantities/histograms.md`` for the layout)."""
        xbins, ybins = self.config.bins
        size = xbins * ybins
        layers = ctx.stat(self._statistic())
        check_layers(layers, size + EXTRA_2D, ctx.param_names)
        rows = stack_layers(layers, size + EXTRA_2D, maxima=2)
        table = rows.cpu().numpy()  # one device sync for all layers
        per_param = np.rint(table[:, :size]).astype(np.int64).reshape(-1, xbins, ybins)
        bad = np.rint(table[:, size : size + 4].sum(0)).astype(np.int64)
        maxima = table[:, size + 4 :].max(0) if len(table) else np.array([-1.0, -1.0])
        (xlo, xhi), (ylo, yhi) = self._range
        out: dict[str, Any] = {
            "hist": per_param.sum(0),
            "x_edges": np.linspace(xlo, xhi, xbins + 1),
            "y_edges": np.linspace(ylo, yhi, ybins + 1),
            "nonfinite": {
                "nan": int(bad[0]),
                "posinf": int(bad[1]),
                "neginf": int(bad[2]),
                "param_nonfinite": int(bad[3]),
            },
            "grad_abs_max": float(maxima[0]) if maxima[0] >= 0 else float("nan"),
            "param_abs_max": float(maxima[1]) if maxima[1] >= 0 else float("nan"),
        }
        if self.config.keep_individual:
            out["per_param"] = per_param
        observed = {"grad_abs_max": float(maxima[0]), "param_abs_max": float(maxima[1])}
        self._range = tuple(  # type: ignore[assignment]
            old if adapt is None else adapt.new_range(observed[adapt.kind], old)
            for adapt, old in zip(self.config.adapt, self._range)
        )
        return out
