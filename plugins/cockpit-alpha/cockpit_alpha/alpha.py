"""Normalized local step size alpha of a noise-aware quadratic fit along the update."""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from pydantic import Field
from torch import Tensor

from cockpit_alpha._directions import UpdatePredictor, generic_direction
from cockpit_alpha._fit import fit_quadratic, normalized_step
from cockpit_alpha._span import StartGroup, fit_updates_in_span, same_shape_groups, stack
from cockpit_core import (
    SUM_GRAD_SQUARED,
    PerSampleGrads,
    PooledGrads,
    QuantityConfig,
    Requirements,
    ResumeContext,
    Statistic,
    StepContext,
    TwoStepQuantity,
    per_sample_projection,
    per_sample_transform,
)

BASIS = ("gradient", "parameters", "predicted update")
"""Directions each layer's per-sample gradients are projected onto at the start point."""


class AlphaConfig(QuantityConfig):
    """Options of :class:`Alpha`."""

    span_rtol: float = Field(
        1e-6,
        gt=0.0,
        lt=1.0,
        description="Report 'exact' when each layer's real update lies in the span of the "
        "start point's projection directions up to this relative residual (plus float "
        "rounding); the part outside the span always gets a diagonal approximation.",
    )


_Key = tuple[int, tuple[int, ...]]
"""A parameter by storage and shape: the transforms get ``param.detach()``, not ``param``."""


def _key(param: Tensor) -> _Key:
    return (param.data_ptr(), tuple(param.shape))


@dataclass(eq=False)
class _Start:
    """What the start point keeps until the end point: O(D) memory, no per-sample gradients.

    Same-shaped parameters are kept stacked (:class:`~cockpit_alpha._span.StartGroup`), so
    that the end point works on a few stacks instead of every layer.
    """

    step: int
    f: float
    var_f: float
    batch_size: int
    groups: list[StartGroup]  # theta, g stacked; predicted update, sum_n g_n^2 per parameter
    proj: Tensor  # [P, B, 3] float64: g_n . (gradient, parameters, predicted update)
    predictor: str
    params: list[Tensor]  # the live parameters (not copies), for the update
    index: dict[_Key, tuple[int, int]]  # (group, row) by storage
    update: list[Tensor] | None = None  # per group d = theta_end - theta, at the end point

    @classmethod
    def build(
        cls,
        params: Sequence[Tensor],
        *,
        theta: Sequence[Tensor],
        grad: Sequence[Tensor],
        direction: Sequence[Tensor],
        sum_sq: Sequence[Tensor],
        proj: Sequence[Tensor],
        **scalars: Any,
    ) -> _Start:
        """The state from per-parameter tensors, grouped by same-shaped parameters.

        ``theta`` and ``grad`` are stacked (copied), ``direction`` and ``sum_sq`` kept, the
        ``[B, 3]`` projections ``proj`` stacked in the order of the groups. ``scalars``:
        ``step``, ``f``, ``var_f``, ``batch_size`` and ``predictor``.
        """
        groups = same_shape_groups(params)
        order = [i for group in groups for i in group]
        if order:
            device = proj[order[0]].device
            stacked = stack([t.to(device) for t in proj], order).to(torch.float64)
        else:
            stacked = torch.zeros(0, scalars["batch_size"], 3, dtype=torch.float64)
        return cls(
            **scalars,
            groups=[
                StartGroup(
                    group,
                    theta=stack(theta, group),
                    grad=stack(grad, group),
                    direction=[direction[i] for i in group],
                    sum_sq=[sum_sq[i] for i in group],
                )
                for group in groups
            ],
            proj=stacked,
            params=list(params),
            index={
                _key(params[i]): (g, row)
                for g, group in enumerate(groups)
                for row, i in enumerate(group)
            },
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept tensors (read by the core's cache accounting)."""
        tensors = [self.proj, *(self.update or [])]
        tensors += [t for group in self.groups for t in group.tensors]
        return sum(t.element_size() * t.nelement() for t in tensors)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint: the arguments of :meth:`build`, per parameter."""
        order = [i for group in self.groups for i in group.indices]
        return {
            "step": self.step,
            "f": self.f,
            "var_f": self.var_f,
            "batch_size": self.batch_size,
            "predictor": self.predictor,
            "theta": _unstack([(g.indices, g.theta.unbind()) for g in self.groups]),
            "grad": _unstack([(g.indices, g.grad.unbind()) for g in self.groups]),
            "direction": _unstack([(g.indices, g.direction) for g in self.groups]),
            "sum_sq": _unstack([(g.indices, g.sum_sq) for g in self.groups]),
            "proj": _unstack([(order, self.proj.unbind())]),
        }


def _unstack(parts: Sequence[tuple[list[int], Sequence[Tensor]]]) -> list[Tensor]:
    """The tensors in parameter order, from parts that hold those at ``indices``."""
    rows = {i: t for indices, tensors in parts for i, t in zip(indices, tensors)}
    return [rows[i] for i in range(len(rows))]


class Alpha(TwoStepQuantity):
    """Normalized local step size alpha (Mahsereci & Hennig, 2017; Cockpit 1.0.2).

    Along the update ``d = theta_{s+1} - theta_s`` (length ``t = ||d||``, direction
    ``u = d / t``) a parabola ``mu_0 + mu_1 x + mu_2 x^2`` is fitted by weighted least
    squares to the mini-batch loss ``f`` at ``x = 0`` (step ``s``) and ``x = t`` (step
    ``s + 1``, the next mini-batch) and to the slopes ``df = g . u``, each weighted by its
    sampling variance: ``var_f = Var_n(l_n)`` and ``var_df = Var_n(g_n . u)`` (both with
    ``B - 1``). Then ``alpha = 2 t / x_bar - 1`` with ``x_bar = -mu_1 / mu_2``: ``0`` means
    the step reached the minimum of the parabola, ``1`` its far side, ``-1`` no progress
    (also reported when the parabola is not convex). The value is stored under ``s``.

    Any optimizer: ``d`` is the real parameter change. The end point projects its
    per-sample gradients onto the known ``d`` during backpropagation. At the start point
    ``d`` is not known yet, so each layer's per-sample gradients are projected onto three
    directions: the layer's gradient, its parameters and the update predicted from
    ``info["optimizer"]`` (SGD with momentum/weight decay/Nesterov, Adam, AdamW, RMSprop;
    see :mod:`cockpit_alpha._directions`), kept from the previous tracked step. These
    projections are formed after backpropagation, on directions from the final gradient,
    so under ``torch.distributed`` they are those of the global batch (the end point's
    direction ``d`` is equal on every process). After the step each layer's ``d`` is split into its least-squares fit ``d_fit`` in that span and
    a residual ``r``: ``g_n . d_fit`` follows exactly from the ``B x 3`` projections and
    ``Var_n(g_n . r)`` is approximated by ``sum_i r_i^2 Var_n([g_n]_i)`` (covariances
    ignored). With a correct prediction ``r`` is rounding noise and the value equals the
    definition (``exact: True`` when every ``||r|| <= span_rtol ||d||`` plus rounding).
    Memory: four parameter-sized tensors and ``B x 3`` numbers per layer, never ``B x D``
    (during the end point's backward pass one more: the update). Same-shaped parameters
    are kept stacked and fitted together (:mod:`cockpit_alpha._span`): a tracked step
    costs a few dozen tensor operations per group of same-shaped parameters, and a few per
    parameter in the callbacks the core calls for each parameter (the directions, the
    projections on the update).
    """

    name = "alpha"
    Config = AlphaConfig
    config: AlphaConfig

    def __init__(self, config: Any = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        self._predictor: UpdatePredictor | None = None
        self._live: weakref.ref[_Start] | None = None
        self._used: set[str] = set()
        self._directions: dict[_Key, Tensor] = {}
        self._transform_error: Exception | None = None

    # -- requirements ---------------------------------------------------------------------

    def _start_statistic(self) -> Statistic:
        # projected after backward, on directions from the final gradient: exact under DDP
        return per_sample_projection(
            f"alpha_start[{self.key}]",
            self._start_directions,
            pooled_directions=self._start_directions_pooled,
        )

    def _end_statistic(self) -> Statistic:
        return per_sample_transform(
            f"alpha_end[{self.key}]",
            self._end_transform,
            reduce="gather",  # g_n . d, with the update d equal on every process
            factored_fn=self._end_factored,
            pooled_fn=self._end_pooled,
        )

    def start_requirements(self) -> Requirements:
        """Sum of squared per-sample gradients, the start projections, the losses."""
        return Requirements(
            statistics=(SUM_GRAD_SQUARED, self._start_statistic()),
            info=frozenset({"individual_losses"}),
        )

    def end_requirements(self) -> Requirements:
        """The end projections onto the update, the losses."""
        return Requirements(
            statistics=(self._end_statistic(),), info=frozenset({"individual_losses"})
        )

    # -- projection directions (after backward) and transforms (must never raise) ---------

    # A factored layer (linear: g_n = d_n a_n^T, convolution: g_n = D_n U_n^T, embedding
    # rows) is projected without forming the per-sample gradients (grads.dot).

    def _start_directions(self, grad: Tensor, param: Tensor) -> Tensor:
        """``[3, *shape]``: the gradient, the parameters and the predicted update.

        The core calls it after backward with the final mini-batch gradient (of the global
        batch under ``torch.distributed``) and projects the per-sample gradients on the
        result; the predicted update is kept for :meth:`compute_start`. If it raises, the
        core reports the statistic missing with the error, and training goes on.
        """
        if self._predictor is None:
            direction, how = generic_direction(grad), "generic"
        else:
            direction, how = self._predictor(param, grad)
        self._used.add(how)
        direction = direction.to(grad.dtype)
        self._directions[_key(param)] = direction
        return torch.stack([grad, param.to(grad.dtype), direction])

    def _start_directions_pooled(self, grads: Tensor, params: tuple[Tensor, ...]) -> Any:
        """:meth:`_start_directions` of ``P`` same-shaped parameters at once, ``[P, 3, *shape]``.

        ``NotImplemented`` (the core then asks per parameter) where the optimizer's update
        cannot be predicted for all of them at once (see ``UpdatePredictor.stacked``).
        """
        theta = torch.stack(params).to(grads.dtype)
        if self._predictor is None:
            predicted: tuple[Tensor, str] | None = (generic_direction(grads), "generic")
        else:
            predicted = self._predictor.stacked(params, theta, grads)
        if predicted is None:
            return NotImplemented
        direction, how = predicted
        self._used.add(how)
        direction = direction.to(grads.dtype)
        for param, row in zip(params, direction.unbind(0)):
            self._directions[_key(param)] = row
        return torch.stack([grads, theta, direction], dim=1)

    def _end_transform(self, per_sample: Tensor, param: Tensor) -> Tensor:
        try:
            update = self._update(param).to(per_sample.dtype)
            if per_sample.dim() != 2:  # not a vector's per-sample gradients [B, n]
                per_sample, update = per_sample.reshape(len(per_sample), -1), update.reshape(-1)
            return per_sample @ update
        except Exception as err:  # reported by compute_end; training goes on
            self._transform_error = err
            return per_sample.new_empty(0)

    def _end_factored(self, grads: PerSampleGrads, param: Tensor) -> Tensor:
        try:
            return grads.dot(self._update(param, as_row=True))[:, 0]
        except Exception as err:  # reported by compute_end; training goes on
            self._transform_error = err
            return param.new_empty(0)

    def _end_pooled(self, pool: PooledGrads) -> Tensor:
        """``g_n . d`` of a pool of same-shaped parameters at once, ``[P, B]``."""
        try:
            updates = self._updates(pool.params).reshape(pool.count, -1).to(pool.grads.dtype)
            return torch.bmm(updates.unsqueeze(1), pool.grads.mT)[:, 0]  # d G^T: see pool
        except Exception as err:  # reported by compute_end; training goes on
            self._transform_error = err
            return pool.grads.new_empty(pool.count, 0)

    def _update(self, param: Tensor, as_row: bool = False) -> Tensor:
        """The update of ``param`` since the start point (``as_row``: ``[1, *shape]``).

        The first call of an end point forms the updates of all parameters, one stack per
        group; the others take a row.
        """
        state = self._live() if self._live is not None else None
        if state is None:
            raise RuntimeError("the start point's state is gone")
        group, row = state.index[_key(param)]
        if state.update is None:
            state.update = [stack(state.params, g.indices).sub_(g.theta) for g in state.groups]
        update = state.update[group]
        return update[row : row + 1] if as_row else update[row]

    def _updates(self, params: Sequence[Tensor]) -> Tensor:
        """``[P, *shape]``: the updates of same-shaped ``params``, rows of one group if they are."""
        state = self._live() if self._live is not None else None
        if state is None:
            raise RuntimeError("the start point's state is gone")
        places = [state.index[_key(p)] for p in params]
        group, first = places[0]
        if places == [(group, first + k) for k in range(len(places))]:
            self._update(params[0])  # forms the updates at the first call
            assert state.update is not None
            return state.update[group][first : first + len(places)]
        return torch.stack([self._update(p) for p in params])

    # -- start and end --------------------------------------------------------------------

    def compute_start(self, ctx: StepContext) -> _Start:
        """Keep f, Var(l_n), theta, g, sum_n g_n^2, the predicted update and projections."""
        layers = self._layers(ctx, self._start_statistic())  # [B, 3] per parameter
        directions, self._directions = self._directions, {}
        self._remember_optimizer(ctx)
        batch = next((t.shape[0] for t in layers if t is not None), 0)
        f, var_f = _loss_statistics(ctx.info, batch)
        sum_sq = ctx.stat(SUM_GRAD_SQUARED)
        proj, direction = [], []
        for p, out in zip(ctx.params, layers):
            if out is None:  # parameter without gradient
                proj.append(torch.zeros(batch, 3, dtype=torch.float64, device=p.device))
                direction.append(torch.zeros_like(p))
            else:
                proj.append(out)
                direction.append(directions[_key(p)])
        used, self._used = self._used, set()
        state = _Start.build(
            ctx.params,
            theta=ctx.params,  # stacked: copies
            grad=ctx.grads,
            direction=direction,
            sum_sq=[torch.zeros_like(p) if s is None else s for p, s in zip(ctx.params, sum_sq)],
            proj=proj,
            step=ctx.step,
            f=f,
            var_f=var_f,
            batch_size=batch,
            predictor="generic" if "generic" in used or not used else used.pop(),
        )
        self._live = weakref.ref(state)
        return state

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Whether an optimizer's update was predicted (it serves the next start point)."""
        return {"predictor": None if self._predictor is None else self._predictor.kind}

    def load_state_dict(self, state: dict[str, Any], ctx: ResumeContext) -> None:
        """Predict the optimizer's update again from the Cockpit's ``optimizer``, if known.

        Without it the resumed run's first start point projects on the generic direction
        (``predictor: "generic"``); from its end point on the optimizer is known again.
        """
        if state.get("predictor") is not None and ctx.optimizer is not None:
            self._predictor = UpdatePredictor(ctx.optimizer)

    def start_state_dict(self, state: _Start) -> dict[str, Any]:
        """The start point's numbers and tensors."""
        return state.to_dict()

    def load_start_state(self, data: Any, ctx: ResumeContext) -> _Start:
        """The start point, matched to the resumed run's parameters."""
        state = _Start.build(ctx.params, **data)
        self._live = weakref.ref(state)
        return state

    def compute_end(self, ctx: StepContext, state: _Start) -> dict[str, Any]:
        """Fit the parabola and return alpha with the fit's inputs (layout in the docs)."""
        layers = self._layers(ctx, self._end_statistic())
        self._remember_optimizer(ctx)
        batch = next((t.numel() for t in layers if t is not None), 0)
        f_end, var_f_end = _loss_statistics(ctx.info, batch)
        fit = fit_updates_in_span(
            state.groups,
            state.proj,
            ctx.params,
            ctx.grads,
            state.batch_size,
            self.config.span_rtol,
        )
        t = math.sqrt(fit.step_sq)
        out: dict[str, Any] = {
            "alpha": -1.0,
            "exact": True,
            "predictor": state.predictor,
            "step_length": t,
            "f": [state.f, f_end],
            "var_f": [state.var_f, var_f_end],
            "df": [math.nan, math.nan],
            "var_df": [math.nan, math.nan],
            "fit": [math.nan] * 3,
        }
        if t == 0.0:  # no step: no progress (Cockpit 1.0.2 also gives -1)
            return out
        slope = [fit.start_dot / t, fit.end_dot / t]
        # with no layer, batch = 0 and _loss_statistics raised above
        end_proj = torch.stack([o for o in layers if o is not None]).to(torch.float64).sum(0) / t
        var_df = [
            float(fit.in_span.var()) / t**2 + fit.diagonal / t**2,
            float(end_proj.var()),
        ]
        mu = fit_quadratic(t, out["f"], slope, out["var_f"], var_df)
        out.update(
            alpha=normalized_step(mu, t),
            exact=fit.exact,
            df=slope,
            var_df=var_df,
            fit=[math.nan] * 3 if mu is None else [float(m) for m in mu],
        )
        return out

    # -- helpers --------------------------------------------------------------------------

    def _layers(self, ctx: StepContext, statistic: Statistic) -> list[Tensor | None]:
        # None for a parameter without gradient (the transform never ran on it)
        layers = cast("list[Tensor | None]", ctx.stat(statistic))
        err, self._transform_error = self._transform_error, None
        if err is not None or any(t is not None and t.numel() == 0 for t in layers):
            raise RuntimeError(
                f"alpha could not project the per-sample gradients at step {ctx.step}: {err}"
            ) from err
        return layers

    def _remember_optimizer(self, ctx: StepContext) -> None:
        """Keep a predictor for ``info['optimizer']``: it serves the next step's transforms."""
        optimizer = ctx.optimizer
        if optimizer is not None:
            self._predictor = UpdatePredictor(optimizer)


def _loss_statistics(info: Mapping[str, Any], batch: int) -> tuple[float, float]:
    """``(f, Var_n(l_n))``: ``info['loss']`` (else the mean of the losses), variance with B-1."""
    losses = torch.as_tensor(info["individual_losses"]).detach().reshape(-1)
    losses = losses.to("cpu", torch.float64)
    if losses.numel() != batch:
        raise ValueError(
            f"info['individual_losses'] has {losses.numel()} entries, but the per-sample "
            f"gradients have {batch} samples: pass the per-sample losses of this mini-batch "
            "(reduction='none'), one per sample."
        )
    if batch < 2:
        raise ValueError(
            "alpha needs at least 2 samples per mini-batch: its variances divide by B - 1."
        )
    loss = info.get("loss")
    f = losses.mean() if loss is None else torch.as_tensor(loss).detach().double().mean()
    return float(f), float(losses.var())
