"""Size of the activations: RMS, largest magnitude and zeros of selected module outputs."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import torch
from pydantic import Field, field_validator

from cockpit_activations._selection import ModuleSelection, first_tensor
from cockpit_core import Probe, Quantity, QuantityConfig, Requirements, StepContext
from cockpit_core.observe.probe import to_host


def float_dtype(name: str) -> torch.dtype:
    """The floating-point ``torch`` dtype called ``name`` (``"bfloat16"``, ``"float8_e4m3fn"``).

    Raises:
        ValueError: ``name`` is not a floating-point dtype of this torch.

    """
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"{name!r} is not a floating-point torch dtype; use names such as 'float16', "
            "'bfloat16', 'float8_e4m3fn' or 'float8_e5m2'"
        )
    return dtype


class ActivationsConfig(QuantityConfig):
    """Options of :class:`Activations`."""

    types: list[str] | None = Field(
        None,
        min_length=1,
        description="Read the modules whose class (or a base class) has one of these names, "
        "e.g. ['Linear', 'LayerNorm']. With 'names' too, a module must match both. Default "
        "(neither given): every block (element of an nn.ModuleList), linear layer (nn.Linear, "
        "transformers' Conv1D) and normalization layer (nn.LayerNorm, nn.RMSNorm, classes "
        "named *LayerNorm or *RMSNorm).",
    )
    names: list[str] | None = Field(
        None,
        min_length=1,
        description="Read the modules whose qualified name (as in model.named_modules()) "
        "matches one of these fnmatch patterns, e.g. ['transformer.h.*']; '*' also matches "
        "dots. With 'types' too, a module must match both.",
    )
    low_precision: list[str] = Field(
        default_factory=list,
        description="Floating-point dtypes, e.g. ['float16', 'bfloat16', 'float8_e4m3fn']: "
        "for each, the share of the nonzero output values below its smallest normal number "
        "(underflow: subnormal or flushed to zero) and above its largest finite number "
        "(overflow), as if the outputs were cast to it.",
    )

    @field_validator("low_precision")
    @classmethod
    def _known_dtypes(cls, names: list[str]) -> list[str]:
        for name in names:
            float_dtype(name)
        if len(set(names)) != len(names):
            raise ValueError(f"each dtype once, got {names}")
        return names


class CallStats(NamedTuple):
    """What the probe keeps of one call of one module (see :func:`reduce_output`).

    Attributes:
        stats: float64 on the output's device: ``[norm, amax, zeros, under_1, ...,
            under_k, over_1, ..., over_k]`` with ``norm = ||x||_2`` and the counts of the
            ``k`` low-precision dtypes.
        elements: Elements of the output.

    """

    stats: torch.Tensor
    elements: int


def reduce_output(output: Any, low_precision: Sequence[torch.dtype] = ()) -> CallStats | None:
    """The statistics of one module output (:func:`first_tensor`); ``None`` without one.

    Runs in the forward hook: reductions of the output where it lies, no copy of it and no
    host synchronization (three passes: the norm, the largest and smallest value, the
    nonzero count; with ``low_precision`` a copy of ``|x|`` and two comparisons per
    dtype). The norm is taken in float32 (float64 for a float64 output) by torch's blocked
    reduction: its sum of squares overflows once ``||x||`` passes ``3.4e38``, that is when
    the values reach about ``1.8e19 / sqrt(N)``, and the RMS is then ``inf`` (``amax``
    stays exact): a blow-up either way, and scaling every output by its maximum first, the
    overflow-proof way, costs three more passes and a copy of every output at every
    tracked step.
    """
    x = first_tensor(output)
    if x is None or x.numel() == 0:
        return None
    x = x.detach()
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    norm = torch.linalg.vector_norm(x, dtype=acc)
    low, high = torch.aminmax(x)
    amax = torch.maximum(high, -low).to(acc)  # NaN if any element is NaN
    counts = [x.numel() - torch.count_nonzero(x)]
    if low_precision:
        a = x.to(acc).abs()
        # the thresholds are compared in `acc`, which holds those of float16, bfloat16 and
        # the float8 types exactly; wider types' become 0 and inf there, which no value passes
        for dtype in low_precision:
            counts.append(((a > 0) & (a < torch.finfo(dtype).tiny)).sum())
        for dtype in low_precision:
            counts.append((a > torch.finfo(dtype).max).sum())
    stats = torch.cat([torch.stack([norm, amax]).double(), torch.stack(counts).double()])
    return CallStats(stats, x.numel())


class Activations(Quantity):
    """RMS, largest magnitude and share of zeros of selected module outputs.

    For each selected module, over every element ``x_i`` of its output in the step's
    forward passes (all calls: micro-batches of gradient accumulation, a module used
    twice), ``N`` elements in all:

    * ``rms = sqrt(sum_i x_i^2 / N)``,
    * ``amax = max_i |x_i|``,
    * ``zero_frac = #{i: x_i == 0} / N``,

    and with ``low_precision``, for each dtype ``d`` and the ``M`` nonzero elements:

    * ``underflow[d] = #{i: 0 < |x_i| < finfo(d).tiny} / M`` (below the smallest normal
      number: stored as a subnormal with fewer significant bits, or flushed to zero),
    * ``overflow[d] = #{i: |x_i| > finfo(d).max} / M`` (beyond the largest finite number:
      ``inf``, or NaN for float8 types without infinity; values within half a unit in the
      last place above it, which round down to it, are counted too).

    The output of a module is the tensor it returns, or the first floating-point tensor of
    a tuple, list or ``ModelOutput`` it returns; a module without one is left out. Reading
    the outputs needs the model (``Cockpit(model, ...)`` or ``cp.attach(model)``).

    Sources: Sun et al., *Massive Activations in Large Language Models* (2024) for ``amax``
    against ``rms``; Wortsman et al., *Small-scale proxies for large-scale Transformer
    training instabilities* (2023) for activation growth; Yang et al., *Tensor Programs V*
    (muP, 2021) coordinate checks for ``rms`` against width.
    """

    name = "activations"
    Config = ActivationsConfig
    config: ActivationsConfig

    @cached_property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """The ``low_precision`` dtypes."""
        return tuple(float_dtype(n) for n in self.config.low_precision)

    @cached_property
    def probe(self) -> Probe:
        """The probe on the selected modules; its key holds every option."""
        c = self.config
        key = f"activations(types={c.types},names={c.names},low_precision={c.low_precision})"
        dtypes = self.dtypes

        def reduce(
            module: torch.nn.Module, inputs: tuple[Any, ...], output: Any
        ) -> CallStats | None:
            return reduce_output(output, dtypes)

        return Probe(key, ModuleSelection(c.types, c.names), reduce)

    def requirements(self) -> Requirements:
        """One probe on the selected modules."""
        return Requirements(probes=(self.probe,))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """``{"modules", "rms", "amax", "zero_frac"}`` (+ ``"underflow"``, ``"overflow"``).

        Modules are listed in the order their first call finished (a block after the
        modules inside it); the arrays are float64, one entry per module.
        """
        found = {
            name: [c for c in calls if c is not None]
            for name, calls in ctx.probe(self.probe.key).items()
        }
        found = {name: calls for name, calls in found.items() if calls}
        rows = to_host([c.stats for calls in found.values() for c in calls])
        host = np.stack(rows) if rows else np.zeros((0, 0))
        k = len(self.dtypes)
        rms, amax, zero_frac = [], [], []
        under: list[np.ndarray] = []
        over: list[np.ndarray] = []
        start = 0
        for calls in found.values():
            s = host[start : start + len(calls)]
            start += len(calls)
            count = float(sum(c.elements for c in calls))
            zeros = s[:, 2].sum()
            rms.append(float(np.sqrt(np.sum(s[:, 0] ** 2) / count)))
            amax.append(np.max(s[:, 1]))
            zero_frac.append(zeros / count)
            nonzero = count - zeros
            with np.errstate(invalid="ignore", divide="ignore"):
                under.append(s[:, 3 : 3 + k].sum(0) / nonzero)
                over.append(s[:, 3 + k : 3 + 2 * k].sum(0) / nonzero)
        out: dict[str, Any] = {
            "modules": list(found),
            "rms": np.asarray(rms, dtype=np.float64),
            "amax": np.asarray(amax, dtype=np.float64),
            "zero_frac": np.asarray(zero_frac, dtype=np.float64),
        }
        if k:
            under_all = np.asarray(under, dtype=np.float64).reshape(len(found), k)
            over_all = np.asarray(over, dtype=np.float64).reshape(len(found), k)
            names = self.config.low_precision
            out["underflow"] = {n: under_all[:, j].copy() for j, n in enumerate(names)}
            out["overflow"] = {n: over_all[:, j].copy() for j, n in enumerate(names)}
        return out
