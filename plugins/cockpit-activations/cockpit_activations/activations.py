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

    Each field is a 0-d tensor on the output's device, left there until the step's
    ``compute`` gathers the fields of every call with one ``torch.stack`` per field and
    dtype and copies them to the host at once (:func:`gather`).

    Attributes:
        norm: ``||x||_2``, float32 (float64 for a float64 output).
        low: ``min_i x_i``, in the output's dtype.
        high: ``max_i x_i``, in the output's dtype.
        nonzero: ``#{i: x_i != 0}`` (int32, int64 beyond ``2**31 - 1`` elements).
        rare: ``[under_1, ..., under_k, over_1, ..., over_k]``, the counts of the ``k``
            low-precision dtypes (int64), or ``None`` without any.
        elements: Elements of the output.

    """

    norm: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    nonzero: torch.Tensor
    rare: torch.Tensor | None
    elements: int

    @property
    def stats(self) -> torch.Tensor:
        """float64 ``[norm, amax, zeros, under_1, ..., over_k]`` of this call (on the device)."""
        amax = torch.maximum(self.high, -self.low).double()  # NaN if any element is NaN
        zeros = self.elements - self.nonzero.double()
        rare = [] if self.rare is None else list(self.rare.double())
        return torch.stack([self.norm.double(), amax, zeros, *rare])


def reduce_output(output: Any, low_precision: Sequence[torch.dtype] = ()) -> CallStats | None:
    """The statistics of one module output (:func:`first_tensor`); ``None`` without one.

    Runs in the forward hook, under ``torch.no_grad()`` (as the probe's hooks call it):
    reductions of the output where it lies, no copy of it and no host synchronization, and
    nothing per call but the reductions (four kernels: the norm, the smallest and largest
    value, the nonzero test and its sum; with ``low_precision`` a copy of ``|x|`` and two
    comparisons per dtype). The nonzero count sums ``x.bool()`` (``x != 0``; NaN counts as
    nonzero) as int32, int64 beyond ``2**31 - 1`` elements: on a CPU several times faster
    than ``torch.count_nonzero`` (2026-12-08, torch 2.13, 131k elements: 50 against 430 µs).
    The norm is taken in float32 (float64 for a float64 output) by torch's blocked
    reduction: its sum of squares overflows once ``||x||`` passes ``3.4e38``, that is when
    the values reach about ``1.8e19 / sqrt(N)``, and the RMS is then ``inf`` (``amax``
    stays exact): a blow-up either way, and scaling every output by its maximum first, the
    overflow-proof way, costs three more passes and a copy of every output at every
    tracked step.
    """
    x = first_tensor(output)
    if x is None or x.numel() == 0:
        return None
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    norm = torch.linalg.vector_norm(x, dtype=acc)
    low, high = torch.aminmax(x)
    count = torch.int32 if x.numel() < 2**31 else torch.int64
    nonzero = x.bool().sum(dtype=count)
    rare = None
    if low_precision:
        a = x.to(acc).abs()
        counts = []
        # the thresholds are compared in `acc`, which holds those of float16, bfloat16 and
        # the float8 types exactly; wider types' become 0 and inf there, which no value passes
        for dtype in low_precision:
            counts.append(((a > 0) & (a < torch.finfo(dtype).tiny)).sum())
        for dtype in low_precision:
            counts.append((a > torch.finfo(dtype).max).sum())
        rare = torch.stack(counts)
    return CallStats(norm, low, high, nonzero, rare, x.numel())


def gather(columns: Sequence[Sequence[torch.Tensor]]) -> list[np.ndarray]:
    """Columns of same-shaped device tensors as float64 numpy arrays ``[n, *shape]``.

    The tensors of a column are stacked per device and dtype (one ``torch.stack`` each,
    converted to float64, which holds every value of the narrower float dtypes and every
    count below ``2**53`` exactly), and everything on one device is copied to the host at
    once: a handful of kernels and one transfer per device for a whole model.
    """
    parts: dict[torch.device, list[tuple[int, list[int], torch.Tensor]]] = {}
    for c, column in enumerate(columns):
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, t in enumerate(column):
            groups.setdefault((t.device, t.dtype), []).append(i)
        for (device, _), index in groups.items():
            stacked = torch.stack([column[i] for i in index]).double()
            parts.setdefault(device, []).append((c, index, stacked))
    out = [
        np.empty((len(column), *(column[0].shape if column else ())), dtype=np.float64)
        for column in columns
    ]
    for device_parts in parts.values():
        flat = torch.cat([t.reshape(-1) for _, _, t in device_parts]).cpu().numpy()
        start = 0
        for c, index, t in device_parts:
            block = flat[start : start + t.numel()].reshape(tuple(t.shape))
            start += t.numel()
            out[c][index] = block
    return out


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
        calls = [c for module_calls in found.values() for c in module_calls]
        k = len(self.dtypes)
        columns: list[list[torch.Tensor]] = [
            [c.norm for c in calls],
            [c.low for c in calls],
            [c.high for c in calls],
            [c.nonzero for c in calls],
        ]
        if k:
            columns.append([c.rare for c in calls if c.rare is not None])
        host = gather(columns)  # the only copy to the host
        norm, low, high, nonzero = host[:4]
        # per module: its calls are consecutive rows; one ufunc reduction per statistic
        sizes = [len(module_calls) for module_calls in found.values()]
        starts = np.cumsum([0, *sizes[:-1]]) if sizes else np.zeros(0, dtype=np.int64)
        count = np.array(
            [float(sum(c.elements for c in module_calls)) for module_calls in found.values()]
        )

        def per_module(ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
            return ufunc.reduceat(values, starts, axis=0) if sizes else values[:0]

        nonzero_count = per_module(np.add, nonzero)
        zeros = count - nonzero_count
        out: dict[str, Any] = {
            "modules": list(found),
            "rms": np.sqrt(per_module(np.add, norm**2) / count),
            "amax": per_module(np.maximum, np.maximum(high, -low)),  # NaN if any element is
            "zero_frac": zeros / count,
        }
        if k:
            rare = host[4].reshape(len(calls), 2 * k)
            with np.errstate(invalid="ignore", divide="ignore"):
                fractions = per_module(np.add, rare) / nonzero_count[:, None]
            names = self.config.low_precision
            out["underflow"] = {n: fractions[:, j].copy() for j, n in enumerate(names)}
            out["overflow"] = {n: fractions[:, k + j].copy() for j, n in enumerate(names)}
        return out
