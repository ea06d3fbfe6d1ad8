"""Histogram of all per-sample gradient elements."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, field_validator
from torch import Tensor

from cockpit_core import (
    EmbeddingGrads,
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
    EXTRA_1D,
    RangeAdaptation,
    check_layers,
    check_range,
    hist1d_layer,
    param_abs_max,
    stack_layers,
)
from cockpit_histograms._factored import hist1d_factored, hist1d_sparse
from cockpit_histograms._pooled import hist1d_pool


class GradHist1dConfig(QuantityConfig):
    """Options of :class:`GradHist1d` (defaults as Cockpit 1.0.2's ``GradHist1d``)."""

    bins: int = Field(100, ge=1, le=100_000, description="Number of bins.")
    range: tuple[float, float] = Field(
        (-2.0, 2.0),
        description="Bin range (low, high); finite values outside are counted in the edge "
        "bins. With 'adapt', the range of the first tracked step.",
    )
    adapt: RangeAdaptation | None = Field(
        None,
        description="Move the range to [-m, m] after each tracked step: "
        "'grad_abs_max', 'param_abs_max' or {kind, padding, min_size}. None: fixed range.",
    )
    keep_individual: bool = Field(
        True, description="Also return each parameter's counts ('per_param', [P, bins])."
    )

    @field_validator("range")
    @classmethod
    def _valid_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        return check_range(value, "range")


class GradHist1d(Quantity):
    """Histogram of the elements of all per-sample gradients ``g_n`` (Dangel et al., 2021).

    Counts every element ``[g_n]_i`` for ``n = 1..B`` and every parameter element ``i``,
    with ``g_n = grad l_n`` the gradient of sample ``n``'s own loss (as Cockpit 1.0.2, which
    histograms ``B * grad_batch``). Bins are ``bins`` equal intervals of ``range``; finite
    values outside are clamped into the edge bins, NaN/inf are counted apart.

    Counts are computed per layer during backpropagation by a ``per_sample_transform``
    (float32 clamp + ``torch.histc`` in chunks of ``2**24`` elements, so counts are exact),
    and the layer's per-sample gradients are freed right after. Small parameters with the
    same number of elements are binned together (``pooled_fn``: one quantization and one
    ``bincount`` for all of them), with the same counts.

    Range adaptation (``adapt``) needs the global maximum before binning, which is only
    known once every layer was binned. So, like Cockpit 1.0.2 (which adapts in ``track``
    after computing the histogram), the maximum observed at a tracked step sets the range
    of the next tracked step. Unlike Cockpit, it only ignores non-finite values and adapts
    on the histogram's own schedule (Cockpit gives the adaptation its own schedule).

    Reference: Schneider, Dangel & Hennig, "Cockpit: A Practical Debugging Tool for the
    Training of Deep Neural Networks", NeurIPS 2021.
    """

    name = "grad_hist_1d"
    Config = GradHist1dConfig
    config: GradHist1dConfig

    def __init__(self, config: Any = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        self._range: tuple[float, float] = tuple(self.config.range)  # type: ignore[assignment]

    @property
    def current_range(self) -> tuple[float, float]:
        """The range the next tracked step bins into."""
        return self._range

    def state_dict(self) -> dict[str, Any]:
        """The range of the next tracked step (adapted with ``adapt``)."""
        return {"range": [float(v) for v in self._range]}

    def load_state_dict(self, state: dict[str, Any], ctx: ResumeContext) -> None:
        """Bin into the saved run's next range."""
        if "range" in state:
            low, high = (float(v) for v in state["range"])
            self._range = (low, high)

    def _statistic(self) -> Statistic:
        bins = self.config.bins
        if self.config.adapt is None:
            lo, hi = self._range
            key = f"grad_hist_1d(bins={bins},range=({lo!r},{hi!r}))"
        else:  # the range changes from step to step: this instance's own statistic
            key = f"grad_hist_1d[{self.key}](bins={bins},adaptive)"
        # counts add up across processes; the last entry (max |g|) is a maximum
        return per_sample_transform(
            key,
            self._transform,
            reduce="sum",
            max_last=1,
            factored_fn=self._factored,
            pooled_fn=self._pooled,
        )

    def requirements(self) -> Requirements:
        """One per-sample transform whose key encodes the bins and the range."""
        return Requirements(statistics=(self._statistic(),))

    # A failing transform never breaks backward(): the core records the error and
    # ctx.stat then raises it in compute().
    def _transform(self, per_sample: Tensor, param: Tensor) -> Tensor:
        lo, hi = self._range
        return hist1d_layer(per_sample, lo, hi, self.config.bins)

    def _factored(self, grads: PerSampleGrads, param: Tensor) -> Any:
        lo, hi = self._range
        if isinstance(grads, OuterProductGrads) and not grads.has_sequence:
            return hist1d_factored(grads.d, grads.a, lo, hi, self.config.bins)
        if isinstance(grads, EmbeddingGrads):  # the rows each sample touched, and zeros
            n_zero = grads.batch_size * grads.num_embeddings * grads.dim - grads.rows.numel()
            return hist1d_sparse(grads.rows, n_zero, lo, hi, self.config.bins)
        return NotImplemented  # e.g. convolutions: the core bins blocks of samples with fn

    def _pooled(self, pool: PooledGrads) -> Tensor:
        lo, hi = self._range
        return hist1d_pool(pool.grads, lo, hi, self.config.bins)

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return the histogram (see ``docs/quantities/histograms.md`` for the layout)."""
        bins = self.config.bins
        layers = ctx.stat(self._statistic())
        check_layers(layers, bins + EXTRA_1D, ctx.param_names)
        rows = stack_layers(layers, bins + EXTRA_1D, maxima=1)
        table = rows.cpu().numpy()  # one device sync for all layers
        per_param = np.rint(table[:, :bins]).astype(np.int64)
        bad = np.rint(table[:, bins : bins + 3].sum(0)).astype(np.int64)
        grad_abs_max = float(table[:, bins + 3].max()) if len(table) else -1.0
        lo, hi = self._range
        out: dict[str, Any] = {
            "hist": per_param.sum(0),
            "edges": np.linspace(lo, hi, bins + 1),
            "nonfinite": {"nan": int(bad[0]), "posinf": int(bad[1]), "neginf": int(bad[2])},
            "grad_abs_max": grad_abs_max if grad_abs_max >= 0 else float("nan"),
        }
        if self.config.keep_individual:
            out["per_param"] = per_param
        adapt = self.config.adapt
        if adapt is not None:
            observed = grad_abs_max if adapt.kind == "grad_abs_max" else param_abs_max(ctx.params)
            self._range = adapt.new_range(observed, self._range)
        return out
