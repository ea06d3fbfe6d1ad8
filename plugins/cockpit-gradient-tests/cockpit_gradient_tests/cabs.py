"""Coupled adaptive batch size, CABS (Balles, Romero & Hennig, 2017)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from pydantic import Field

from cockpit_core import (
    SUM_GRAD_SQUARED,
    MisuseError,
    Quantity,
    QuantityConfig,
    Requirements,
    StepContext,
    layered,
    tracked_params,
)
from cockpit_gradient_tests._common import elementwise_variances


class CABSConfig(QuantityConfig):
    """Options of :class:`CABS`."""

    lr: float | None = Field(
        None,
        gt=0,
        description="Learning rate to use in the rule. Default (null): read each parameter's "
        "'lr' from the param_groups of info['optimizer'] at every step, as Cockpit 1.0.2 does.",
    )


class CABS(Quantity):
    """Batch size suggested by the CABS rule.

    Balles, Romero & Hennig (2017), "Coupling adaptive batch sizes with learning rates",
    Eq. (22): the batch size that keeps the gradient noise in balance with the progress
    of SGD with learning rate ``lr`` is

        B_cabs = lr * tr(Sigma) / L,    tr(Sigma) = sum_d ( (1/B) sum_n g_{n,d}^2 - g_d^2 ),

    with ``Sigma`` the (population, divide by ``B``) covariance of the per-sample gradients
    and ``L`` the mini-batch loss (an estimate of ``f - f*``, assuming ``f* = 0``).

    The learning rate is each parameter's ``lr`` in ``optimizer.param_groups`` (or the
    ``lr`` option); groups with different learning rates contribute
    ``lr_p * tr(Sigma_p) / L`` each (Cockpit 1.0.2 raises for non-unique learning rates and
    for any optimizer but plain SGD). The rule is derived for plain SGD. With momentum
    ``mu`` the steady-state step along a constant gradient is ``lr / (1 - mu)``, so the
    rule for that effective step size is this value times ``1 / (1 - mu)``. For Adam and
    other adaptive methods ``lr`` is not a step size in gradient units and the value has no
    derivation: read it as a trend (how the noise-to-loss ratio evolves), not as a batch size.

    Output: ``{"total": B_cabs, "per_param": [lr_p tr(Sigma_p) / L]}``; the entries sum to
    the total. Under FSDP2 the traces are sums of every process's rows and the learning
    rates are looked up for the tracked ``DTensor`` s (``cockpit_core.tracked_params``).
    """

    name = "cabs"
    shards = True  # FSDP2: rows of ctx.grads; _common sums over processes
    Config = CABSConfig
    config: CABSConfig

    def requirements(self) -> Requirements:
        """``SUM_GRAD_SQUARED`` and ``info["loss"]``; ``info["optimizer"]`` unless ``lr`` is set."""
        info = frozenset({"loss"} if self.config.lr is not None else {"loss", "optimizer"})
        return Requirements(statistics=(SUM_GRAD_SQUARED,), info=info)

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": float, "per_param": np.ndarray}`` of the suggested batch size."""
        _, groups, _, var = elementwise_variances(ctx, self.key, unbiased=False)
        trace = groups.sums(var)
        lrs = trace.new_tensor(self._learning_rates(ctx))
        per_param = lrs * trace / _loss_value(ctx.info["loss"])
        return layered(per_param.sum(), per_param)

    def _learning_rates(self, ctx: StepContext) -> list[float]:
        if self.config.lr is not None:
            return [self.config.lr] * len(ctx.params)
        params = tracked_params(ctx.params)  # as the optimizer holds them (FSDP2: DTensors)
        return learning_rates(ctx.info["optimizer"], params, ctx.param_names, self.key)


def learning_rates(
    optimizer: Any, params: Sequence[torch.Tensor], names: Sequence[str], key: str
) -> list[float]:
    """The ``lr`` of the param group holding each of ``params``.

    Raises:
        MisuseError: ``optimizer`` has no ``param_groups`` with an ``lr``, or does not
            optimize some of the tracked parameters.

    """
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise MisuseError(
            f"'{key}' reads the learning rate from info['optimizer'].param_groups, but got "
            f"{type(optimizer).__name__}. Pass the torch.optim.Optimizer, or set the "
            "quantity's 'lr' option."
        )
    lr_of: dict[int, float] = {}
    for group in groups:
        if "lr" not in group:
            raise MisuseError(
                f"'{key}': a param group of {type(optimizer).__name__} has no 'lr'. Set the "
                "quantity's 'lr' option."
            )
        for p in group["params"]:
            lr_of[id(p)] = float(group["lr"])
    missing = [n for n, p in zip(names, params) if id(p) not in lr_of]
    if missing:
        raise MisuseError(
            f"'{key}': the tracked parameters {missing} are in no param group of "
            "info['optimizer']. Pass the optimizer that trains them, or set the quantity's "
            "'lr' option."
        )
    return [lr_of[id(p)] for p in params]


def _loss_value(loss: Any) -> float:
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise MisuseError(
                f"info['loss'] has shape {tuple(loss.shape)}; CABS needs the scalar mini-batch "
                "loss (the mean of the per-sample losses)."
            )
        return float(loss.detach())
    return float(loss)
