"""The model's output logits: log partition function, largest logit and z-loss."""

from __future__ import annotations

from functools import cached_property
from typing import Any, NamedTuple

import torch
from pydantic import Field

from cockpit_core import Probe, Quantity, QuantityConfig, Requirements, StepContext
from cockpit_core.engine.losses import logits_of

CHUNK_ELEMENTS = 2**24
"""Most logits converted to float32 at once (64 MiB): the conversion of a large
``[batch, sequence, vocabulary]`` tensor in low precision happens piece by piece."""


class LogitsConfig(QuantityConfig):
    """Options of :class:`Logits`."""

    coef: float = Field(
        1e-4,
        ge=0.0,
        description="Weight of the z-loss value coef * mean(log Z^2) (PaLM's 1e-4).",
    )


class LogitsCall(NamedTuple):
    """What the probe keeps of one forward pass of the model.

    Attributes:
        stats: float64 on the logits' device: ``[sum log Z, sum (log Z)^2, max log Z,
            max logit]`` over the positions.
        positions: Number of positions (every dimension but the last).

    """

    stats: torch.Tensor
    positions: int


def model_itself(name: str, module: torch.nn.Module) -> bool:
    """Select only the model (``""``), whose output holds the logits."""
    return name == ""


def reduce_logits(output: Any) -> LogitsCall:
    """Log Z of every position of the logits in ``output`` (:func:`logits_of`), reduced.

    ``log Z = logsumexp`` over the last dimension, in float64 for float64 logits and in
    float32 otherwise (converted at most :data:`CHUNK_ELEMENTS` at a time); the per-position
    values are then summed in float64. Nothing leaves the device.

    Raises:
        TypeError: No logits in ``output``, or logits without a class dimension.

    """
    x = logits_of(output).detach()
    if x.dim() == 0 or x.numel() == 0:
        raise TypeError(f"logits of shape {list(x.shape)} have no classes to normalize over")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows = x.reshape(-1, x.shape[-1])
    per_chunk = max(1, CHUNK_ELEMENTS // rows.shape[1])
    if rows.shape[0] <= per_chunk:  # one piece: no split, no concatenation
        log_z = torch.logsumexp(rows.to(acc), dim=-1).double()
    else:
        log_z = torch.cat(
            [torch.logsumexp(c.to(acc), dim=-1).double() for c in rows.split(per_chunk, dim=0)]
        )
    stats = torch.stack([log_z.sum(), log_z.square().sum(), log_z.max(), x.amax().double()])
    return LogitsCall(stats, log_z.numel())


class Logits(Quantity):
    """Log partition function ``log Z`` of the output logits, largest logit and z-loss.

    With logits ``z`` of shape ``[..., C]`` (every leading dimension a position: batch,
    sequence; the last the classes or vocabulary), per position ``p``
    ``log Z_p = log sum_c exp(z_pc)``, over the ``P`` positions of the step's forward passes
    (all micro-batches):

    * ``log_z_mean = sum_p log Z_p / P``, ``log_z_max = max_p log Z_p``,
    * ``max_logit = max_pc z_pc``,
    * ``z_loss = coef * sum_p (log Z_p)^2 / P``.

    Cross-entropy is invariant to a shift of the logits; ``log Z`` drifting away from 0 and
    the logits growing are what the z-loss (PaLM: Chowdhery et al., 2022) penalizes and what
    Wortsman et al., *Small-scale proxies for large-scale Transformer training
    instabilities* (2023), identify as output-logit divergence. The value is the z-loss
    term the model *would* add, not one that is added.

    The logits are read from the model's output: the tensor it returns, its ``.logits``
    (``transformers``' ``ModelOutput``), or the first item of a tuple (nanoGPT's
    ``(logits, loss)``). Every position counts, padding included (the probe does not see
    the targets). Needs the model (``Cockpit(model, ...)`` or ``cp.attach(model)``).
    """

    name = "logits"
    Config = LogitsConfig
    config: LogitsConfig

    @cached_property
    def probe(self) -> Probe:
        """The probe on the model's output (shared by every ``logits`` quantity)."""

        def reduce(module: torch.nn.Module, inputs: tuple[Any, ...], output: Any) -> LogitsCall:
            return reduce_logits(output)

        return Probe("logits(log_z,max)", model_itself, reduce)

    def requirements(self) -> Requirements:
        """One probe on the model itself."""
        return Requirements(probes=(self.probe,))

    def compute(self, ctx: StepContext) -> dict[str, float]:
        """``{"log_z_mean", "log_z_max", "max_logit", "z_loss"}``."""
        calls = ctx.probe(self.probe.key)[""]
        stats = torch.stack([c.stats for c in calls]).cpu().numpy()  # one copy to the host
        positions = float(sum(c.positions for c in calls))
        return {
            "log_z_mean": float(stats[:, 0].sum() / positions),
            "log_z_max": float(stats[:, 2].max()),
            "max_logit": float(stats[:, 3].max()),
            "z_loss": float(self.config.coef * stats[:, 1].sum() / positions),
        }
