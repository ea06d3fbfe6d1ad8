"""The ``autodiff`` provider: exact curvature diagonals of any model, recomputed after backward.

BackPACK computes curvature diagonals during the user's backward pass, but only for the
modules it has rules for (no LayerNorm, attention, GELU, residual blocks). This provider
needs no rules: after the user's ``backward()`` it recomputes the mean loss of the batch
in ``info["inputs"]`` / ``info["targets"]`` with ``torch.func.functional_call`` on the
attached model and per-sample loss (as the built-in ``func`` provider does), and

- ``diag_hessian``: takes the gradient ``g = dL/dtheta`` with ``create_graph=True`` and,
  per parameter ``p`` with ``D_p`` entries, differentiates ``g_p`` once more against blocks
  of unit vectors ``V`` (``k x D_p``) in one batched call,
  ``torch.autograd.grad(g_p, p, grad_outputs=V, is_grads_batched=True)``; row ``j`` of the
  result is ``H_pp e_idx_j``, so ``H[idx_j, idx_j] = (H V)[j, idx_j]`` (Pearlmutter, 1994,
  "Fast exact multiplication by the Hessian"). Exact, and ``D`` Hessian-vector products
  per step (``D`` the tracked entries), ``block`` of them per backward pass.
- ``diag_ggn_exact`` / ``diag_ggn_mc``: :func:`cockpit_autodiff.ggn_diagonal.ggn_diagonal`
  (per-sample vector-Jacobian products with the loss Hessian's square root, or sampled
  labels), when that module is present.

Double backward, not ``torch.func.hessian``: the latter returned a wrong, asymmetric
Hessian on LayerNorm weights (``shared/DESIGN.md`` section 4). Attention runs in the math
kernel of ``scaled_dot_product_attention`` (the fused kernels have no double backward).

Cost control: the Hessian diagonal is refused (``supports()`` says why, naming the
estimators) when the tracked parameters have more than ``max_hvps`` entries (default
50 000); set the bound per Cockpit (:mod:`cockpit_autodiff.registry`:
``Cockpit(..., registry=autodiff_registry(max_hvps=N))``), or use ``hess_trace`` with
``method="hutchinson"``, ``"hutchpp"`` or ``"xtrace"``. It never degrades silently to an
estimate.

Randomness: ``diag_ggn_mc`` draws from the provider's own ``torch.Generator`` (option
``mc_seed``), never from the global RNG, so tracking it leaves the training's random
stream (dropout, data order) as it would be without cockpit.

Under a ``torch.amp.GradScaler`` nothing needs unscaling: the loss is recomputed, so
:attr:`~cockpit_core.Collection.loss_scale` does not enter. The ``cost`` (20) is above
BackPACK's (5) and ``func``'s (10): ``backend="auto"`` uses BackPACK wherever it supports
the model, this provider elsewhere. The model must give the same outputs when re-run (no
dropout, no BatchNorm in training mode).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from cockpit_autodiff.options import (
    DEFAULT_BLOCK,
    DEFAULT_MAX_HVPS,
    OPTION_NAMES,
    AutodiffOptions,
    resolve_options,
)
from cockpit_core import Collection, MissingInfoError, ParamSlot, StatisticProvider
from cockpit_core.engine.attention import math_attention
from cockpit_core.errors import MisuseError
from cockpit_core.statistics.func import as_call, batch_length

ggn_diagonal: Callable[..., dict[str, Tensor]] | None
try:  # written separately; until it exists the GGN kinds are declined with a reason
    from cockpit_autodiff.ggn_diagonal import ggn_diagonal
except ImportError:  # pragma: no cover - depends on the installed version
    ggn_diagonal = None

GGN_KINDS = frozenset({"diag_ggn_exact", "diag_ggn_mc"})

LOSSES = ("cross_entropy", "mse")
"""Losses :func:`ggn_diagonal` knows."""


def hvp_refusal(entries: int, limit: int) -> str:
    """Why the exact Hessian diagonal of ``entries`` parameter entries is refused, and what to use."""
    return (
        f"the exact Hessian diagonal needs one Hessian-vector product per parameter entry: "
        f"{entries:,} per tracked step, above max_hvps={limit:,}. Use an estimator: "
        "hess_trace with method='hutchinson' (probes=S Rademacher probes, S Hessian-vector "
        "products; expected error: standard deviation sqrt(2 (||H||_F^2 - sum_i H_ii^2) / S) "
        "per block, at most sqrt(2/S) ||H||_F), method='hutchpp' or method='xtrace' (the "
        "same S products, smaller error when a few eigenvalues dominate; each reports its "
        "std_error), and for the TIC quantities curvature='hutchinson' or 'xdiag' (estimated "
        "diagonal with std_error) or 'diag_ggn_mc'; or raise the bound for this Cockpit: "
        "Cockpit(..., provider_options={'autodiff': {'max_hvps': N}})"
    )


def hessian_diagonal(
    loss_of: Callable[[dict[str, Tensor]], Tensor],
    params: Mapping[str, Tensor],
    block: int = DEFAULT_BLOCK,
) -> dict[str, Tensor]:
    """The exact diagonal of the Hessian of ``loss_of(params)``, per parameter.

    Args:
        loss_of: The scalar loss as a function of the parameters (a dict like ``params``).
        params: The point, e.g. ``{name: p}`` of ``model.named_parameters()`` (detached
            copies are differentiated; the tensors are not changed).
        block: Unit vectors per batched double-backward call.

    Returns:
        ``{name: diagonal of d^2 loss / d p^2}``, each shaped like its parameter.

    """
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    with torch.enable_grad():
        loss = loss_of(leaves)
        grads = torch.autograd.grad(
            loss, list(leaves.values()), create_graph=True, allow_unused=True
        )
        out = {}
        for (name, p), g in zip(leaves.items(), grads):
            out[name] = _block_diagonal(g, p, block).view_as(p)
    return out


def _block_diagonal(g: Tensor | None, p: Tensor, block: int) -> Tensor:
    """``diag(d g / d p)`` by batched products with blocks of unit vectors."""
    size = p.numel()
    diag = torch.zeros(size, dtype=p.dtype, device=p.device)
    if g is None or not g.requires_grad:  # the loss is at most linear in p
        return diag
    block = max(1, int(block))
    for start in range(0, size, block):
        k = min(block, size - start)
        rows = torch.arange(k, device=p.device)
        cols = rows + start
        units = torch.zeros(k, size, dtype=p.dtype, device=p.device)
        units[rows, cols] = 1
        try:
            (hv,) = torch.autograd.grad(
                g,
                p,
                grad_outputs=units.view(k, *p.shape),
                is_grads_batched=True,
                retain_graph=True,
                allow_unused=True,
            )
        except RuntimeError:  # an operation without a vmap rule in its backward: one by one
            hv = torch.stack([_one_hvp(g, p, u.view_as(p)) for u in units])
        if hv is not None:
            diag[start : start + k] = hv.reshape(k, size)[rows, cols].detach()
    return diag


def _one_hvp(g: Tensor, p: Tensor, v: Tensor) -> Tensor:
    (hv,) = torch.autograd.grad(g, p, grad_outputs=v, retain_graph=True, allow_unused=True)
    return torch.zeros_like(p) if hv is None else hv


def loss_name(loss_fn: Any) -> str | None:
    """``"cross_entropy"`` or ``"mse"`` for a per-sample loss cockpit can name, else ``None``.

    Recognized: ``nn.CrossEntropyLoss``/``nn.MSELoss`` modules, ``F.cross_entropy`` /
    ``F.mse_loss`` (also in a ``functools.partial``), and callables (or the objects of bound
    methods) with an attribute ``loss`` set to one of the names (e.g.
    ``cockpit_core.testing.Problem.individual_losses``).
    """
    if isinstance(loss_fn, torch.nn.CrossEntropyLoss):
        return "cross_entropy"
    if isinstance(loss_fn, torch.nn.MSELoss):
        return "mse"
    fn = getattr(loss_fn, "func", loss_fn)
    if fn is F.cross_entropy:
        return "cross_entropy"
    if fn is F.mse_loss:
        return "mse"
    for owner in (loss_fn, getattr(loss_fn, "__self__", None)):
        name = getattr(owner, "loss", None)
        if isinstance(name, str) and name in LOSSES:
            return name
    return None


class AutodiffProvider(StatisticProvider):
    """Exact curvature diagonals of any model, from a loss recomputed after ``backward``.

    Needs ``cp.attach(model, loss_fn)`` (a per-sample loss) and the batch in
    ``info["inputs"]`` and ``info["targets"]``. Class attributes are the defaults of the
    options (:class:`~cockpit_autodiff.options.AutodiffOptions`, the provider's
    ``options_model``); a Cockpit's ``provider_options={"autodiff": {...}}`` take
    precedence, and :meth:`configured` makes a subclass with other defaults (for one
    registry, see :func:`~cockpit_autodiff.registry.autodiff_registry`).

    Attributes:
        max_hvps: Largest number of tracked parameter entries (= Hessian-vector products
            per step) for which ``diag_hessian`` is computed; above it ``supports()``
            declines and names the estimators.
        block: Unit vectors per batched double-backward call (memory grows linearly).
        mc_seed: Seed of the provider's own generator of ``diag_ggn_mc``'s draws.
        settings: This instance's validated options.

    """

    name = "autodiff"
    options_model = AutodiffOptions
    cost = 20.0
    description = (
        "autodiff: exact Hessian/GGN diagonals of any model, recomputed after backward "
        "(one Hessian-vector product per parameter entry)"
    )
    kinds = frozenset({"diag_hessian", "diag_ggn_exact", "diag_ggn_mc"})
    recomputes = True
    max_hvps: int = DEFAULT_MAX_HVPS
    block: int = DEFAULT_BLOCK
    mc_seed: int = 0

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        options: Mapping[str, Any] | None = None,
    ):
        super().__init__(params, names, options)
        self.settings: AutodiffOptions = resolve_options(self.defaults(), self.options)
        self._generator: torch.Generator | None = None
        self._named: dict[int, str] | None = None

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The class's option defaults (its attributes ``max_hvps``, ``block``, ``mc_seed``)."""
        return {key: getattr(cls, key) for key in OPTION_NAMES}

    @classmethod
    def configured(cls, **options: Any) -> type[AutodiffProvider]:
        """A subclass whose defaults are ``options`` (validated), for one registry.

        Raises:
            ConfigError: An unknown option or an invalid value.

        """
        settings = resolve_options(cls.defaults(), options, only_known=False)
        return type(cls.__name__, (cls,), {"__module__": cls.__module__, **settings.model_dump()})

    @property
    def hvp_limit(self) -> int:
        """``max_hvps`` of this instance."""
        return self.settings.max_hvps

    def mc_generator(self) -> torch.Generator:
        """The generator of ``diag_ggn_mc``'s draws: seeded once, then advanced step by step.

        Seeded with ``mc_seed + 1000003 r`` on process ``r`` of ``torch.distributed``, so
        processes draw independently; micro-batches of one step draw one after the other.
        """
        if self._generator is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            seed = self.settings.mc_seed + 1_000_003 * rank
            self._generator = torch.Generator().manual_seed(seed)
        return self._generator

    def attach(self, model: torch.nn.Module, loss_fn: Any = None) -> None:  # noqa: D102
        super().attach(model, loss_fn)
        self._named = None

    def _names(self) -> dict[int, str]:
        """``id(param) -> name`` in the attached model."""
        if self.model is None:
            return {}
        if self._named is None:
            self._named = {id(p): n for n, p in self.model.named_parameters()}
        return self._named

    def hessian_entries(self) -> int:
        """Tracked entries of the attached model whose Hessian diagonal would be computed."""
        names = self._names()
        return sum(p.numel() for p in self.params if id(p) in names and p.requires_grad)

    def supports(self, slot: ParamSlot, kind: Any) -> str | None:
        """Every parameter of an attached model, within ``max_hvps`` (Hessian) or a known loss (GGN)."""
        if self.model is None or self.loss_fn is None:
            return "needs the model and a per-sample loss: call cp.attach(model, loss_fn)"
        if id(slot.param) not in self._names():
            return "the parameter is not one of the attached model's"
        if kind == "diag_hessian":
            entries = self.hessian_entries()
            if entries > self.hvp_limit:
                return hvp_refusal(entries, self.hvp_limit)
            return None
        if kind in GGN_KINDS:
            if ggn_diagonal is None:
                return "cockpit_autodiff.ggn_diagonal is not available in this installation"
            if loss_name(self.loss_fn) is None:
                return (
                    "the GGN needs the loss's Hessian: attach nn.CrossEntropyLoss or "
                    "nn.MSELoss (reduction='none') or F.cross_entropy as loss_fn"
                )
            return None
        return f"the autodiff provider does not compute {kind}"

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Check the batch is in ``info``; compute the diagonals once ``backward`` returned."""
        if collection.statistics:
            self._check_ready(collection)
        yield
        for stat in collection.statistics:
            served = [
                i
                for i in sorted(collection.targets[stat.identity])
                if self.params[i].grad is not None
            ]
            if not served:
                continue
            try:
                values = self._compute(stat, served, collection.info)
            except Exception as err:  # never break the user's training: report, go on
                text = f"{type(err).__name__}: {err}".splitlines()[0]
                collection.fail(
                    stat,
                    f"the 'autodiff' provider could not compute {stat.describe()} ({text}). "
                    "Check that loss_fn(model(inputs), targets) runs again on info['inputs'] "
                    "and is twice differentiable.",
                )
                continue
            if isinstance(values, str):
                collection.fail(stat, values)
                continue
            for i in served:
                collection.store(stat, i, values[i])

    def _check_ready(self, collection: Collection) -> None:
        if self.model is None or self.loss_fn is None:
            raise MisuseError(
                "The autodiff provider recomputes the loss from the model and a per-sample "
                "loss: call cp.attach(model, loss_fn) before training, e.g. "
                "cp.attach(model, torch.nn.CrossEntropyLoss(reduction='none'))."
            )
        if "inputs" not in collection.info:
            raise MissingInfoError(
                "Curvature diagonals of the attached model are recomputed by the 'autodiff' "
                "provider, which needs the batch: pass info={'inputs': x, 'targets': y, ...} "
                "to cp(step, info=...)."
            )

    def _compute(self, stat: Any, served: list[int], info: Mapping[str, Any]) -> Any:
        """``{index: value}`` for ``served``, or a message saying why not."""
        model, loss_fn = self.model, self.loss_fn
        assert model is not None
        names = self._names()
        tracked = {names[id(self.params[i])]: self.params[i] for i in served}
        inputs = info["inputs"]
        targets: Any = info.get("targets")  # as the user passed it; the recomputation checks it
        if stat.kind == "diag_hessian":
            entries = sum(p.numel() for p in tracked.values())
            if entries > self.hvp_limit:
                return hvp_refusal(entries, self.hvp_limit)
            const = {n: p.detach() for n, p in model.named_parameters() if n not in tracked}
            const.update(dict(model.named_buffers()))
            batch = batch_length(inputs)
            args, kwargs = as_call(inputs)

            def mean_loss(theta: dict[str, Tensor]) -> Tensor:
                out = functional_call(model, {**theta, **const}, args, kwargs)
                losses: Tensor = loss_fn(out) if targets is None else loss_fn(out, targets)
                # per-sample losses [B]; an elementwise loss ([B, ...]) is averaged per sample
                return losses.reshape(batch, -1).mean(1).sum() / batch

            with math_attention():
                diag = hessian_diagonal(mean_loss, tracked, self.settings.block)
        else:
            if ggn_diagonal is None:
                return "cockpit_autodiff.ggn_diagonal is not available in this installation"
            loss = loss_name(loss_fn)
            if loss is None:
                return "the GGN needs a loss cockpit can name (cross-entropy or MSE)"
            mc = dict(stat.options).get("mc_samples", 1) if stat.kind == "diag_ggn_mc" else None
            detached = {n: p.detach() for n, p in tracked.items()}
            gen = self.mc_generator() if mc is not None else None
            with math_attention():
                diag = ggn_diagonal(
                    model, detached, inputs, targets, loss, mc_samples=mc, generator=gen
                )
        return {i: diag[names[id(self.params[i])]].detach() for i in served}
