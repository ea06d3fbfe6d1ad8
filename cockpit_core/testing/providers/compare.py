"""Comparing a provider's statistics with autograd definitions (:data:`TOLERANCE`).

:class:`_Reference` computes the definitions at one tracked step on a fresh copy of the
model in float64; :func:`compare_values` checks every recorded value of a run against them and
records the result in the :class:`~cockpit_core.testing.ProviderReport`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from cockpit_core.engine.attention import math_attention
from cockpit_core.statistics.provider import StatisticProvider
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.problems import Problem
from cockpit_core.testing.providers.checks import ProviderReport, StatisticCheck
from cockpit_core.testing.providers.reference import reference_statistic
from cockpit_core.testing.providers.session import TRACKED, Session, Snapshot
from cockpit_core.testing.reference import explicit_ggn, explicit_hessian, per_sample_gradients

TOLERANCE = 1e-10
"""Largest accepted error of a value, relative to the size of its reference (see
:func:`~cockpit_core.testing.check_provider`)."""


class _Reference:
    """Autograd definitions at one tracked step, on a fresh copy of the model (float64)."""

    def __init__(self, problem: Problem, make: Callable[[], torch.nn.Module], snap: Snapshot):
        self.problem, self.snap = problem, snap
        self.model = make()
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(snap.params[n])
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]

    @cached_property
    def per_sample(self) -> dict[str, Tensor]:
        """``g_n`` of each parameter, ``[B, *shape]``, by one autograd call per sample."""
        grads = per_sample_gradients(self.model, self.problem, self.snap.x, self.snap.y)
        return dict(zip(self.names, grads))

    def _diagonal(self, matrix: Tensor) -> dict[str, Tensor]:
        diag = matrix.diagonal()
        params = [p for p in self.model.parameters() if p.requires_grad]
        parts = torch.split(diag, [p.numel() for p in params])
        return {n: d.reshape(p.shape) for n, d, p in zip(self.names, parts, params)}

    @cached_property
    def diag_hessian(self) -> dict[str, Tensor]:
        """Diagonal of the explicit Hessian of the mean loss."""
        with math_attention():  # fused attention kernels have no double backward
            hessian = explicit_hessian(self.model, self.problem, self.snap.x, self.snap.y)
        return self._diagonal(hessian)

    @cached_property
    def diag_ggn(self) -> dict[str, Tensor]:
        """Diagonal of the explicit GGN of the mean loss."""
        return self._diagonal(explicit_ggn(self.model, self.problem, self.snap.x, self.snap.y))

    def value(self, check: StatisticCheck, name: str) -> Tensor:
        """The reference value of ``check`` for parameter ``name``."""
        if check.mode == "hessian":
            return self.diag_hessian[name]
        if check.mode == "ggn":
            return self.diag_ggn[name]
        return reference_statistic(
            check.stat, self.per_sample[name], self.snap.params[name], self.snap.grads[name]
        )


# -- comparisons -----------------------------------------------------------------------------


def _label(run: Session, name: str) -> str:
    owner = run.model
    for part in name.split(".")[:-1]:
        owner = getattr(owner, part)
    return f"'{name}' ({type(owner).__name__})"


def compare_values(
    provider_cls: type[StatisticProvider], run: Session, report: ProviderReport
) -> None:
    """Compare every recorded statistic of ``run`` with its reference."""
    cls = provider_cls.__name__
    for step in TRACKED:
        if step not in run.recorder.seen:
            raise ConformanceError(
                f"{cls}: the Cockpit recorded nothing at tracked step {step} on {run.what}."
            )
        seen = run.recorder.seen[step]
        snap = run.snapshots[step]
        reference = _Reference(run.problem, run.make, snap)
        for check in run.checks:
            values = seen[check.stat.describe()]
            if isinstance(values, str):
                raise ConformanceError(
                    f"{cls}: {check.label} is missing on {run.what} at step {step}, although "
                    f"supports() accepted every parameter of the run ({values}). Fill "
                    "collection.results for every served parameter with a gradient "
                    "(collection.deliver / collection.store), or make supports() return why "
                    "not."
                )
            expected: dict[str, Tensor] = {}
            for i, name in enumerate(run.names):
                value = values[i]
                if snap.grads[name] is None:
                    if value is not None:
                        raise ConformanceError(
                            f"{cls}: {check.label} of parameter {_label(run, name)} on "
                            f"{run.what} at step {step} is {short_message(value)}, but the parameter "
                            "got no gradient: leave statistics of parameters whose p.grad is "
                            "None unset (None)."
                        )
                    continue
                if value is None:
                    raise ConformanceError(
                        f"{cls}: {check.label} of parameter {_label(run, name)} on {run.what} "
                        f"at step {step} was not delivered, although supports() accepted it "
                        "and it has a gradient. Deliver it (collection.deliver / "
                        "collection.store) or return a reason from supports()."
                    )
                if check.mode in ("mc", "present"):
                    _check_present(cls, check, run, name, step, value)
                else:
                    expected[name] = reference.value(check, name).detach()
            _check_close(cls, check, run, step, values, expected)
            done = report.checked.setdefault(run.problem.name, {}).setdefault(check.label, [])
            done.extend(n for n in run.names if n not in done)


def short_message(value: Any) -> str:
    """What ``value`` is, in a few words, for a failure message (a tensor by its shape)."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return type(value).__name__


def _check_present(
    cls: str, check: StatisticCheck, run: Session, name: str, step: int, value: Any
) -> None:
    where = f"{check.label} of parameter {_label(run, name)} on {run.what} at step {step}"
    if not isinstance(value, Tensor):
        raise ConformanceError(f"{cls}: {where} is a {type(value).__name__}, not a tensor.")
    if not torch.isfinite(value).all():
        raise ConformanceError(f"{cls}: {where} is not finite.")
    if check.mode == "mc":
        shape = tuple(dict(run.model.named_parameters())[name].shape)
        if tuple(value.shape) != shape:
            raise ConformanceError(
                f"{cls}: {where} has shape {list(value.shape)}, expected the parameter's shape "
                f"{list(shape)}."
            )
        if (value < 0).any():
            raise ConformanceError(
                f"{cls}: {where} has negative entries (min {float(value.min()):.3e}): {check.hint}."
            )


def _check_close(
    cls: str,
    check: StatisticCheck,
    run: Session,
    step: int,
    values: Sequence[Any],
    expected: Mapping[str, Tensor],
) -> None:
    if not expected:
        return
    overall = max(float(e.abs().max()) if e.numel() else 0.0 for e in expected.values())
    for i, name in enumerate(run.names):
        if name not in expected:
            continue
        value, ref = values[i], expected[name]
        where = f"{check.label} of parameter {_label(run, name)} on {run.what} at step {step}"
        if not isinstance(value, Tensor):
            raise ConformanceError(
                f"{cls}: {where} is a {type(value).__name__}; statistics are tensors."
            )
        if tuple(value.shape) != tuple(ref.shape):
            raise ConformanceError(
                f"{cls}: {where} has shape {list(value.shape)}, expected {list(ref.shape)}: "
                f"{check.hint}."
            )
        diff = float((value.detach().to(torch.float64) - ref.to(torch.float64)).abs().max())
        own = float(ref.abs().max()) if ref.numel() else 0.0
        scale = max(own, 1e-6 * overall) or 1.0
        error = diff / scale
        if not error <= TOLERANCE:
            raise ConformanceError(
                f"{cls}: {where} differs from the autograd reference: max error {error:.3e} "
                f"(max |difference| {diff:.3e} relative to the reference's size {scale:.3e}) "
                f"> {TOLERANCE:g}. To fix it: {check.hint}."
            )
