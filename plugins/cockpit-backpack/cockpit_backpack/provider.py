"""The ``backpack`` provider: statistics from BackPACK's extensions (Dangel et al., 2020).

"BackPACK: Packing more into backprop" (ICLR 2020) extends ``backward()`` with
first-order (``BatchGrad``: per-sample gradients) and second-order extensions
(``DiagHessian``, ``DiagGGNExact``, ``DiagGGNMC``: curvature diagonals). The model and the
loss module must be extended (:func:`cockpit_backpack.extend`).

All statistics of a module's parameters are computed in BackPACK's ``extension_hook``,
right after that module's backward pass, and BackPACK's save fields are deleted at once,
so per-sample gradients of one layer are never alive together with those of the next.
BackPACK scales per-sample gradients of a mean-reduced loss by ``1/B``; this provider
undoes the scaling (``g_n`` is the gradient of sample ``n``'s own loss).

Linear and Conv2d weights are kept in factored form
(:class:`~cockpit_core.statistics.per_sample.OuterProductGrads`,
:class:`~cockpit_core.statistics.conv.ConvGrads`).

The user's own extensions, ``cp(step, DiagGGNExact(), KFAC(), info=...)`` as in Cockpit
1.0.2, run in the same ``with backpack(...)`` and their results stay on the parameters
(``p.diag_ggn_exact``, ``p.kfac``); cockpit deletes only its own save fields. An extension
equal to one of cockpit's (same class and hyperparameters) runs once, the user's instance,
and cockpit reads its statistics from it (a dense ``p.grad_batch`` of ``BatchGrad()``
instead of the factored one); one that differs only in its hyperparameters is a
``RequirementConflictError`` (:mod:`cockpit_backpack.requests`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from backpack import backpack
from backpack.context import CTX
from backpack.extensions import BatchGrad, DiagGGNExact, DiagGGNMC, DiagHessian
from backpack.extensions.backprop_extension import BackpropExtension
from backpack.extensions.firstorder.base import FirstOrderModuleExtension
from torch import Tensor

from cockpit_backpack import hook_switch as hooks
from cockpit_backpack.conv2d import DiagGGNConv2dFast, DiagHConv2dFast, UnfoldConv2d, layer_input
from cockpit_backpack.guarded import guarded
from cockpit_backpack.requests import describe, merge
from cockpit_core.errors import CockpitWarning
from cockpit_core.statistics.conv import ConvGrads, ConvWeightFactors
from cockpit_core.statistics.per_sample import DenseGrads, OuterProductGrads
from cockpit_core.statistics.provider import Collection, ParamSlot, StatisticProvider
from cockpit_core.statistics.statistic import Statistic

# statistic kind -> (BackPACK extension, save field)
CURVATURE = {
    "diag_hessian": (DiagHessian, "diag_h"),
    "diag_ggn_exact": (DiagGGNExact, "diag_ggn_exact"),
    "diag_ggn_mc": (DiagGGNMC, "diag_ggn_mc"),
}
_SAVE_FIELDS = ("grad_batch", *(f for _, f in CURVATURE.values()))


class BackpackProvider(StatisticProvider):
    """Per-sample statistics (``BatchGrad``) and curvature diagonals from BackPACK."""

    name = "backpack"
    cost = 5.0
    description = "BackPACK extensions: per-sample gradients and curvature diagonals"
    observes_forward = True
    per_sample = True
    kinds = frozenset(CURVATURE)

    @classmethod
    def prepare(cls, module: torch.nn.Module) -> torch.nn.Module:
        """BackPACK's ``extend`` (:func:`cockpit_backpack.extend`): its statistics start there."""
        return hooks.extend(module)

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        options: Mapping[str, Any] | None = None,
    ):
        super().__init__(params, names, options)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._batch_grad = BatchGrad()
        self._batch_grad.set_module_extension(torch.nn.Linear, _FactoredLinear(), overwrite=True)
        self._batch_grad.set_module_extension(torch.nn.Conv2d, UnfoldConv2d(), overwrite=True)
        self._unsupported: dict[str, list[tuple[str, str]]] = {}
        self._warned_fields: set[str] = set()  # the user's save fields warned about missing

    # -- routing ------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module, loss_fn: Any = None) -> None:  # noqa: D102
        super().attach(model, loss_fn)
        self._unsupported = {}

    def supports(self, slot: ParamSlot, kind: Any) -> str | None:
        """Per-sample kinds on extended modules that ``BatchGrad`` supports.

        BatchNorm in training mode is refused (its per-sample gradients are not defined;
        BackPACK would only warn).

        Curvature diagonals need every module of the model supported by the extension.
        Without a known model every parameter is accepted: BackPACK's hooks find the
        modules during ``backward`` (and what they miss is reported then).
        """
        if kind.per_sample:
            if slot.module is None:
                return None  # no model known: BackPACK's hooks find the modules
            if slot.shared:
                return "the parameter is registered by several modules (tied weights)"
            if (
                isinstance(slot.module, torch.nn.modules.batchnorm._BatchNorm)
                and slot.module.training
            ):
                return (
                    "in training mode BatchNorm mixes the samples of a batch, so per-sample "
                    "gradients are not defined"
                )
            supported = _supported_modules(self._batch_grad) or set()
            if type(slot.module) not in supported:
                return f"BackPACK BatchGrad does not support {type(slot.module).__name__}"
            if not getattr(slot.module, hooks.EXTENDED_FLAG, False):
                return "the module is not extended (cockpit_backpack.extend(model))"
            return None
        if slot.module is None or self.model is None:
            return None
        if kind not in self._unsupported:
            self._unsupported[kind] = self.unsupported_modules(self.model, Statistic(kind))
        bad = self._unsupported[kind]
        if bad:
            mods = ", ".join(f"'{n}' ({c})" for n, c in bad)
            return f"BackPACK {CURVATURE[kind][0].__name__} does not support {mods}"
        return None

    def unsupported_modules(self, model: torch.nn.Module, stat: Statistic) -> list[tuple[str, str]]:
        """``(module name, class name)`` of modules for which ``stat`` cannot be computed.

        Per-sample statistics need BackPACK support for every module that owns tracked
        parameters; curvature statistics need it for every module on the way (activations,
        pooling, ...) as well.
        """
        extension = self._extensions([stat])[0]
        supported = _supported_modules(extension)
        if supported is None:  # BackPACK internals changed; cannot tell statically
            return []
        tracked = {id(p) for p in self.params}
        out = []
        for name, module in model.named_modules():
            if list(module.children()):
                continue  # containers: their leaves are checked
            owns_tracked = any(id(p) in tracked for p in module.parameters(recurse=False))
            relevant = owns_tracked or (stat.kind in CURVATURE and not _is_trivial(module))
            if relevant and type(module) not in supported:
                out.append((name or type(module).__name__, type(module).__name__))
        return out

    def accepts(self, request: Any) -> bool:
        """BackPACK extensions (instances), e.g. ``DiagGGNExact()``, ``KFAC()``, ``BatchGrad()``."""
        return isinstance(request, BackpropExtension)

    # -- the forward pass ---------------------------------------------------------------

    def arm(self, indices: frozenset[int]) -> None:
        """Install BackPACK's hooks (of modules extended by ``extend``) only when needed."""
        hooks.want(self, bool(indices))

    def armed(self, indices: frozenset[int]) -> bool:
        """Whether the hooks are on, or the model has none that can be off (``backpack.extend``)."""
        return hooks.installed() or not hooks.switchable(self.model)

    def suspended(self) -> contextlib.AbstractContextManager[None]:
        """Hide BackPACK's module hooks while another provider runs its own pass."""
        if self.model is None:
            return contextlib.nullcontext()
        return without_backpack_hooks(self.model)

    def close(self) -> None:  # noqa: D102
        hooks.withdraw(self)

    # -- the step -----------------------------------------------------------------------

    def _extensions(
        self, stats: Sequence[Statistic], loss_scale: float = 1.0
    ) -> list[BackpropExtension]:
        """The BackPACK extensions that produce ``stats``.

        Under a GradScaler (``loss_scale != 1``) the Hessian diagonal also needs the exact
        GGN diagonal: see :func:`_unscaled_hessian_diagonal`.
        """
        exts: list[BackpropExtension] = []
        if loss_scale != 1.0 and any(s.kind == "diag_hessian" for s in stats):
            if not any(s.kind == "diag_ggn_exact" for s in stats):
                stats = [*stats, Statistic("diag_ggn_exact")]
        # Every per-sample statistic is derived from BatchGrad, so a statistic has the same
        # value whichever other quantities share the step.
        if any(s.per_sample for s in stats):
            exts.append(self._batch_grad)
        for stat in stats:
            if stat.kind not in CURVATURE:
                continue
            cls = CURVATURE[stat.kind][0]
            options = (
                {"mc_samples": dict(stat.options).get("mc_samples", 1)} if cls is DiagGGNMC else {}
            )
            ext = guarded(cls, stat.identity, self.params, **options)
            fast = DiagHConv2dFast() if cls is DiagHessian else DiagGGNConv2dFast()
            ext.set_module_extension(torch.nn.Conv2d, fast, overwrite=True)
            exts.append(ext)
        return exts

    def _needs(self, collection: Collection, exts: Sequence[Any]) -> dict[int, str]:
        """For ``id()`` of each of cockpit's extensions, what needs it (for conflict messages)."""

        def of(stats: Sequence[Statistic]) -> str:
            owners = list(
                dict.fromkeys(q for s in stats for q in collection.owners.get(s.identity, ()))
            )
            names = ", ".join(s.describe() for s in stats)
            which = "quantity" if len(owners) == 1 else "quantities"
            by = f" of {which} {', '.join(repr(q) for q in owners)}" if owners else ""
            return (
                f"the statistic {names}{by}" if len(stats) == 1 else f"the statistics {names}{by}"
            )

        needs = {}
        for ext in exts:
            if ext is self._batch_grad:
                needs[id(ext)] = "the per-sample " + of(
                    [s for s in collection.statistics if s.per_sample]
                ).removeprefix("the ")
                continue
            ident = getattr(ext, "cockpit_statistic", None)
            stats = [s for s in collection.statistics if s.identity == ident]
            if not stats:  # the exact GGN diagonal that unscales the Hessian's under a GradScaler
                stats = [s for s in collection.statistics if s.kind == "diag_hessian"]
            needs[id(ext)] = of(stats) if stats else "a quantity"
        return needs

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Run the user's backward pass inside ``with backpack(...)`` and reduce per module.

        The user's extensions (:attr:`Collection.requests`) run in the same pass, merged by
        value with cockpit's (:func:`cockpit_backpack.requests.merge`); their save fields
        are left on the parameters.

        Raises:
            RequirementConflictError: A user's extension conflicts with another (before
                ``backward``).

        """
        stats = collection.statistics
        if CTX.get_active_exts():  # BackPACK runs one set of extensions per backward pass
            for stat in stats:
                collection.fail(stat, NESTED)
            yield
            return
        modules: dict[int, str] = {}
        seen: list[bool] = [False]  # the hook ran: BackPACK observed the forward pass
        scale = collection.per_sample_scale  # B (over a GradScaler's scale)
        own = self._extensions(stats, collection.loss_scale)
        exts, kept = merge(own, collection.requests, self._needs(collection, own))
        drop = tuple(f for f in _SAVE_FIELDS if f not in kept)

        def hook(module: torch.nn.Module) -> None:
            seen[0] = True
            for p in module.parameters(recurse=False):
                i = self._index.get(id(p))
                if i is None or not collection.wanted(i):
                    continue
                modules[i] = type(module).__name__
                grads = _per_sample_grads(getattr(p, "grad_batch", None), scale)
                if grads is not None:
                    collection.deliver(i, grads, defer=True)
                for stat in collection.wanted(i):
                    if stat.kind in CURVATURE:
                        value = getattr(p, CURVATURE[stat.kind][1], None)
                        if value is not None and stat.kind == "diag_hessian":
                            value = _unscaled_hessian_diagonal(p, value, collection.loss_scale)
                        if value is not None:
                            collection.store(stat, i, value.detach())
            for p in module.parameters(recurse=False):
                for save_field in drop:  # cockpit's own; the user's stay
                    if hasattr(p, save_field):
                        delattr(p, save_field)

        with backpack(*exts, extension_hook=hook):
            yield
        self._report_missing(collection, modules, exts)
        if collection.requests and (seen[0] or not hooks.switchable(self.model)):
            self._warn_missing_requests(collection.requests)

    def _warn_missing_requests(self, requests: Sequence[Any]) -> None:
        """Warn (once per save field) about tracked parameters the user's extensions missed.

        BackPACK silently computes nothing for modules that are not extended. Not called
        when no hook ran while the hooks can be off: the core has warned that the forward
        pass was not observed.
        """
        for ext in {e.savefield: e for e in requests}.values():
            if ext.savefield in self._warned_fields:
                continue
            lacking = [
                n
                for n, p in zip(self.names, self.params)
                if p.grad is not None and not hasattr(p, ext.savefield)
            ]
            if not lacking:
                continue
            self._warned_fields.add(ext.savefield)
            where = ", ".join(repr(n) for n in lacking[:5]) + (
                f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
            )
            warnings.warn(
                f"cockpit: BackPACK left p.{ext.savefield} unset for parameter(s) {where} "
                f"although {describe(ext)} was passed to cp(step, ...): BackPACK computes "
                "nothing for modules that are not extended. Extend the model and the loss "
                "function (cockpit_backpack.extend or backpack.extend) before the forward pass. "
                "Warned once.",
                CockpitWarning,
                stacklevel=2,
            )

    def _report_missing(
        self, collection: Collection, modules: dict[int, str], exts: Sequence[BackpropExtension]
    ) -> None:
        failures = {
            ext.cockpit_statistic: ext.cockpit_failure
            for ext in exts
            if getattr(ext, "cockpit_failure", None) is not None
        }
        for stat in collection.statistics:
            lacking = [
                i
                for i in sorted(collection.targets[stat.identity])
                if not collection.received(stat, i) and self.params[i].grad is not None
            ]
            if not lacking:
                continue
            if stat.identity in failures:
                where = ", ".join(f"'{self.names[i]}'" for i in lacking)
                collection.fail(
                    stat,
                    f"{failures[stat.identity]}, so {stat.kind} is missing for parameter(s) "
                    f"{where}: second-order statistics need BackPACK support for every module "
                    "between the loss and a parameter. Track quantities that do not need it "
                    "(e.g. methods based on Hessian-vector products), or replace the module "
                    "(see `cockpit check`).",
                )
            elif not modules:
                collection.fail(
                    stat,
                    f"No statistic {stat.describe()} was computed: BackPACK saw no extended "
                    "module in this backward pass. Extending the model and the loss function "
                    "(model = cockpit_backpack.extend(model), loss_fn = "
                    "cockpit_backpack.extend(loss_fn)) helps only if BackPACK supports every "
                    "module between the loss and the parameters (`cockpit check` lists those "
                    "it does not support).",
                )
            else:
                where = ", ".join(
                    f"'{self.names[i]}' ({modules.get(i, 'module not extended')})" for i in lacking
                )
                collection.fail(
                    stat,
                    f"BackPACK computed no {stat.describe()} for parameter(s) {where}: it does "
                    "not support these modules for this statistic. Track quantities that do "
                    "not need it, or replace the module (see `cockpit check`).",
                )


def _unscaled_hessian_diagonal(p: Tensor, diag_h: Tensor, loss_scale: float) -> Tensor | None:
    """The Hessian diagonal of the unscaled loss from BackPACK's, under a GradScaler.

    BackPACK's ``DiagHessian`` is the GGN diagonal (from the loss module's Hessian, which
    the scaling after the loss module does not reach) plus residual terms of curved
    modules that are linear in the backpropagated gradient, which the GradScaler scales by
    ``s``: ``H_s = G + s R``. So ``H = G + (H_s - G) / s`` (Dangel et al., 2020, Sec. 3).
    """
    if loss_scale == 1.0:
        return diag_h
    ggn = getattr(p, "diag_ggn_exact", None)
    return None if ggn is None else ggn + (diag_h - ggn) / loss_scale


NESTED = (
    "another BackPACK context is active around this backward pass (the step block of a "
    "second Cockpit, or your own `with backpack(...)`), and BackPACK runs one set of "
    "extensions per backward pass: track these parameters with the other Cockpit, pass "
    "your extensions as cp(step, *extensions), or give this Cockpit the model "
    "(Cockpit(model, ...)) so that module hooks serve it."
)
"""Why the statistics of a Cockpit nested in another BackPACK context are missing."""


def _is_trivial(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Identity)


def _supported_modules(extension: object) -> set[type] | None:
    mapping = getattr(extension, "_BackpropExtension__module_extensions", None)
    return set(mapping) if isinstance(mapping, dict) else None


class _LinearWeightFactors:
    """What the factored linear extension stores in ``weight.grad_batch``: ``(a, d)``."""

    def __init__(self, inputs: Tensor, grad_outputs: Tensor):
        self.inputs, self.grad_outputs = inputs, grad_outputs


class _FactoredLinear(FirstOrderModuleExtension):  # type: ignore[misc]  # BackPACK: untyped
    """BatchGrad for ``nn.Linear`` that keeps the factors instead of ``B x out x in`` tensors."""

    def __init__(self) -> None:
        super().__init__(params=["weight", "bias"])

    def weight(  # noqa: D102 - BackPACK API
        self,
        ext: BackpropExtension,
        module: torch.nn.Linear,
        g_inp: tuple[Tensor, ...],
        g_out: tuple[Tensor, ...],
        bp_quantities: object,
    ) -> _LinearWeightFactors:
        return _LinearWeightFactors(layer_input(module).detach(), g_out[0].detach())

    def bias(  # noqa: D102 - BackPACK API
        self,
        ext: BackpropExtension,
        module: torch.nn.Linear,
        g_inp: tuple[Tensor, ...],
        g_out: tuple[Tensor, ...],
        bp_quantities: object,
    ) -> Tensor:
        d = g_out[0].detach()
        return d if d.dim() == 2 else d.sum(dim=tuple(range(1, d.dim() - 1)))


def _per_sample_grads(saved: Any, scale: float) -> Any:
    """Wrap BackPACK's ``grad_batch`` (scaled by ``1/B`` for a mean loss), undoing the scaling."""
    if saved is None:
        return None
    if isinstance(saved, ConvWeightFactors):
        return ConvGrads(saved.scaled(scale))
    if isinstance(saved, _LinearWeightFactors):
        a, d = saved.inputs, saved.grad_outputs * scale
        if a.dim() == 2:
            return OuterProductGrads(a, d)
        # inputs with extra axes [B, ..., in]: g_n = sum_t d_nt a_nt^T, materialize
        return DenseGrads(torch.einsum("n...o,n...i->noi", d, a))
    return DenseGrads(saved.detach() * scale)


@contextlib.contextmanager
def without_backpack_hooks(model: torch.nn.Module) -> Iterator[None]:
    """Hide BackPACK's module hooks while ``torch.func`` transforms run the model.

    BackPACK's full backward hooks use an ``autograd.Function`` that functorch transforms
    reject, and its forward hooks would store batched tensors on the modules. The hook
    dictionaries are swapped for filtered copies and the originals put back afterwards;
    every other hook stays active.
    """
    from backpack import hook_run_extensions, hook_store_io

    banned = (hook_store_io, hook_run_extensions)
    swapped: list[tuple[torch.nn.Module, str, Any]] = []
    try:
        for module in model.modules():
            for attr in ("_forward_hooks", "_backward_hooks"):
                hooks_dict = getattr(module, attr, None)
                if hooks_dict and any(h in banned for h in hooks_dict.values()):
                    swapped.append((module, attr, hooks_dict))
                    kept = type(hooks_dict)(
                        (k, h) for k, h in hooks_dict.items() if h not in banned
                    )
                    setattr(module, attr, kept)
        yield
    finally:
        for module, attr, hooks_dict in reversed(swapped):
            setattr(module, attr, hooks_dict)
