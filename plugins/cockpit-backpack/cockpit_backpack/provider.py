"""Per-sample statistics from BackPACK (Dangel et al., 2020, "BackPACK: Packing more into backprop").

All statistics of a module's parameters are computed in BackPACK's ``extension_hook``,
right after that module's backward pass, and BackPACK's save fields are deleted at once,
so per-sample gradients of one layer are never alive together with those of the next.

BackPACK scales per-sample gradients of a mean-reduced loss by ``1/B``; this backend
undoes the scaling, so statistics follow the convention of
:mod:`cockpit_core.requirements` (``g_n`` is the gradient of sample ``n``'s own loss).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from backpack import backpack
from backpack.extensions import (
    BatchGrad,
    DiagGGNExact,
    DiagGGNMC,
    DiagHessian,
)
from backpack.extensions.firstorder.base import FirstOrderModuleExtension
from torch import Tensor

from cockpit_core.backends.conv_blocks import blocked_statistics
from cockpit_core.backends.conv_grads import (
    ConvWeightFactors,
    DiagGGNConv2dFast,
    DiagHConv2dFast,
    UnfoldConv2d,
)
from cockpit_core.backends.per_sample import ConvGrads, FactoredLinearGrads, MaterializedGrads
from cockpit_core.projection import DeferredGrads
from cockpit_core.requirements import MergedRequirements, Statistic

# statistic kind -> BackPACK save field of the curvature extensions
_CURVATURE_FIELDS = {
    "diag_hessian": "diag_h",
    "diag_ggn_exact": "diag_ggn_exact",
    "diag_ggn_mc": "diag_ggn_mc",
}
_SAVE_FIELDS = ("grad_batch", *_CURVATURE_FIELDS.values())


class BackpackBackend:
    """Computes merged statistics with BackPACK extensions during ``backward``."""

    name = "backpack"

    def __init__(self, params: Sequence[torch.nn.Parameter], param_names: Sequence[str]):
        self.params = list(params)
        self.param_names = list(param_names)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._batch_grad = BatchGrad()
        self._batch_grad.set_module_extension(torch.nn.Linear, _FactoredLinear(), overwrite=True)
        self._batch_grad.set_module_extension(torch.nn.Conv2d, UnfoldConv2d(), overwrite=True)

    def extensions(self, merged: MergedRequirements) -> list:
        """The BackPACK extensions that produce ``merged.statistics``."""
        exts: list = []
        # Every per-sample statistic is derived from BatchGrad, so a statistic has the same
        # value whichever other quantities share the step.
        if merged.per_sample:
            exts.append(self._batch_grad)
        for stat in merged.statistics:
            if stat.kind == "diag_hessian":
                exts.append(_guarded(DiagHessian, stat))
                exts[-1].set_module_extension(torch.nn.Conv2d, DiagHConv2dFast(), overwrite=True)
            elif stat.kind == "diag_ggn_exact":
                exts.append(_guarded(DiagGGNExact, stat))
            elif stat.kind == "diag_ggn_mc":
                exts.append(_guarded(DiagGGNMC, stat, mc_samples=dict(stat.options)["mc_samples"]))
            if stat.kind in ("diag_ggn_exact", "diag_ggn_mc"):
                exts[-1].set_module_extension(torch.nn.Conv2d, DiagGGNConv2dFast(), overwrite=True)
        return exts

    def per_sample_modules(self) -> set[type] | None:
        """Module classes whose parameters get per-sample statistics (``None``: cannot tell)."""
        return _supported_modules(self._batch_grad)

    def unsupported_modules(
        self, model: torch.nn.Module, statistic: Statistic
    ) -> list[tuple[str, str]]:
        """``(module name, class name)`` of modules for which ``statistic`` cannot be computed.

        Per-sample statistics need BackPACK support for every module that owns tracked
        parameters; curvature statistics need it for every module on the way (activations,
        pooling, ...) as well.
        """
        merged = MergedRequirements(statistics=(statistic,), owners={}, loss_graph=False)
        extension = self.extensions(merged)[0]
        supported = _supported_modules(extension)
        if supported is None:  # BackPACK internals changed; cannot tell statically
            return []
        tracked = {id(p) for p in self.params}
        out = []
        for name, module in model.named_modules():
            if list(module.children()):
                continue  # containers: their leaves are checked
            owns_tracked = any(id(p) in tracked for p in module.parameters(recurse=False))
            relevant = owns_tracked or (stat_is_curvature(statistic) and not _is_trivial(module))
            if relevant and type(module) not in supported:
                out.append((name or type(module).__name__, type(module).__name__))
        return out

    @contextmanager
    def collect(
        self, merged: MergedRequirements, batch_size: int
    ) -> Iterator[tuple[dict[tuple[str, str], list[Tensor | None]], dict[tuple[str, str], str]]]:
        """Run the user's backward pass inside this context to fill the statistics.

        Yields:
            ``(statistics, missing)``: ``statistics[identity][i]`` for parameter ``i``
            (filled during backward), and, after the block, ``missing[identity]`` with a
            message for each statistic that some parameters did not receive.

        """
        stats = merged.statistics
        results: dict[tuple[str, str], list[Tensor | None]] = {
            s.identity: [None] * len(self.params) for s in stats
        }
        missing: dict[tuple[str, str], str] = {}
        failures: dict[tuple[str, str], str] = {}
        modules: dict[int, str] = {}

        def hook(module: torch.nn.Module) -> None:
            for p in module.parameters(recurse=False):
                i = self._index.get(id(p))
                if i is None:
                    continue
                modules[i] = type(module).__name__
                self._collect_param(p, i, stats, results, failures, batch_size)
            for p in module.parameters(recurse=False):
                for save_field in _SAVE_FIELDS:
                    if hasattr(p, save_field):
                        delattr(p, save_field)

        exts = self.extensions(merged)
        with backpack(*exts, extension_hook=hook):
            yield results, missing
        missing.update(self._find_missing(stats, results, modules))
        missing.update(self._guard_failures(exts, results))
        missing.update(
            (
                ident,
                f"Computing {dict((s.identity, s) for s in stats)[ident].describe()} raised {msg}",
            )
            for ident, msg in failures.items()
        )

    @staticmethod
    def _collect_param(
        p: torch.nn.Parameter,
        i: int,
        stats: Sequence[Statistic],
        results: dict[tuple[str, str], list[Tensor | None]],
        failures: dict[tuple[str, str], str],
        batch_size: int,
    ) -> None:
        per_sample = _per_sample_grads(getattr(p, "grad_batch", None), batch_size)
        blocked = blocked_statistics(stats, p, per_sample, failures)
        for stat in stats:
            if stat.identity in blocked:
                value = blocked[stat.identity]
            else:
                try:
                    value = _compute(stat, p, per_sample)
                except Exception as err:  # a failing transform must not break backward()
                    failures.setdefault(stat.identity, f"{type(err).__name__}: {err}")
                    continue
            if value is not None:
                results[stat.identity][i] = value.detach()

    def _guard_failures(
        self, exts: Sequence[object], results: dict[tuple[str, str], list[Tensor | None]]
    ) -> dict[tuple[str, str], str]:
        """Messages for curvature statistics whose extension failed on a module."""
        out = {}
        for ext in exts:
            failure = getattr(ext, "cockpit_failure", None)
            if failure is None:
                continue
            ident = ext.cockpit_statistic  # type: ignore[attr-defined]
            lacking = ", ".join(
                f"'{self.param_names[i]}'"
                for i, p in enumerate(self.params)
                if results[ident][i] is None and p.grad is not None
            )
            out[ident] = (
                f"{failure}, so {ident[0]} is missing for parameter(s) {lacking}: second-order "
                "statistics need BackPACK support for every module between the loss and a "
                "parameter. Track quantities that do not need it (e.g. methods based on "
                "Hessian-vector products), or replace the module (see `cockpit check`)."
            )
        return out

    def _find_missing(
        self,
        stats: Sequence[Statistic],
        results: dict[tuple[str, str], list[Tensor | None]],
        modules: dict[int, str],
    ) -> dict[tuple[str, str], str]:
        missing = {}
        for stat in stats:
            values = results[stat.identity]
            lacking = [
                i for i, p in enumerate(self.params) if values[i] is None and p.grad is not None
            ]
            if not lacking:
                continue
            if not modules:
                missing[stat.identity] = (
                    f"No statistic {stat.describe()} was computed: the model and the loss "
                    "function must be extended for BackPACK. Call model = "
                    "cockpit_core.extend(model) and loss_fn = cockpit_core.extend(loss_fn)."
                )
                continue
            where = ", ".join(
                f"'{self.param_names[i]}' ({modules.get(i, 'module not extended')})"
                for i in lacking
            )
            missing[stat.identity] = (
                f"BackPACK computed no {stat.describe()} for parameter(s) {where}: it does not "
                "support these modules for this statistic. Track quantities that do not need "
                "it, or replace the module (see `cockpit check`)."
            )
        return missing


def stat_is_curvature(statistic: Statistic) -> bool:
    """Whether ``statistic`` is a curvature diagonal (needs second-order BackPACK support)."""
    return statistic.kind in _CURVATURE_FIELDS


def _is_trivial(module: torch.nn.Module) -> bool:
    return isinstance(module, (torch.nn.Identity,))


def _supported_modules(extension: object) -> set[type] | None:
    mapping = getattr(extension, "_BackpropExtension__module_extensions", None)
    return set(mapping) if isinstance(mapping, dict) else None


class _GuardedExtension:
    """Mixin for second-order extensions: a module they cannot handle must not break backward().

    BackPACK raises (``NotImplementedError``, then ``AssertionError`` upstream) inside the
    user's ``loss.backward()`` when a second-order extension meets an unsupported module
    (LayerNorm, GELU, ...). The guard records the first error and skips the rest of the
    pass, so gradients are still computed and the statistic is reported as missing.
    """

    cockpit_failure: str | None = None
    cockpit_statistic: tuple[str, str] = ("", "")

    def __call__(self, module: torch.nn.Module, g_inp: tuple, g_out: tuple) -> None:
        if self.cockpit_failure is not None:
            return
        try:
            super().__call__(module, g_inp, g_out)  # type: ignore[misc]
        except Exception as err:
            base = type(self).__mro__[2].__name__
            name = type(module).__name__
            self.cockpit_failure = (
                f"BackPACK's {base} does not support module {name}"
                if isinstance(err, NotImplementedError)
                else f"BackPACK's {base} failed on module {name} ({type(err).__name__}: {err})"
            )


_GUARDED: dict[type, type] = {}


def _guarded(cls: type, stat: Statistic, **kwargs: object) -> object:
    """An instance of the guarded subclass of the BackPACK extension ``cls``."""
    if cls not in _GUARDED:
        _GUARDED[cls] = type(f"Guarded{cls.__name__}", (_GuardedExtension, cls), {})
    extension = _GUARDED[cls](**kwargs)
    extension.cockpit_statistic = stat.identity
    return extension


def _compute(
    stat: Statistic,
    p: torch.nn.Parameter,
    per_sample: MaterializedGrads | FactoredLinearGrads | ConvGrads | None,
) -> Tensor | None:
    """One statistic of one parameter, or ``None`` if BackPACK provided nothing for it."""
    kind = stat.kind
    if kind in _CURVATURE_FIELDS:
        return getattr(p, _CURVATURE_FIELDS[kind], None)
    if per_sample is None:
        return None
    if kind == "batch_l2":
        return per_sample.batch_l2()
    if kind == "sum_grad_squared":
        return per_sample.sum_grad_squared()
    if kind == "batch_dot":
        return per_sample.batch_dot()
    if kind == "grad_batch":
        return per_sample.materialize()
    if kind == "batch_projection":  # projected on the final gradient after backward
        return DeferredGrads(per_sample)
    if stat.factored_fn is not None and per_sample.factored:
        return stat.factored_fn(per_sample, p.detach())
    return stat.fn(per_sample.materialize(), p.detach())  # type: ignore[misc]


class _LinearWeightFactors:
    """What the factored linear extension stores in ``weight.grad_batch``: ``(a, d)``."""

    def __init__(self, inputs: Tensor, grad_outputs: Tensor):
        self.inputs, self.grad_outputs = inputs, grad_outputs


class _FactoredLinear(FirstOrderModuleExtension):
    """BatchGrad for ``nn.Linear`` that keeps the factors instead of ``B x out x in`` tensors."""

    def __init__(self) -> None:
        super().__init__(params=["weight", "bias"])

    def weight(self, ext, module, g_inp, g_out, bp_quantities):  # noqa: D102 - BackPACK API
        return _LinearWeightFactors(module.input0.detach(), g_out[0].detach())

    def bias(self, ext, module, g_inp, g_out, bp_quantities):  # noqa: D102 - BackPACK API
        d = g_out[0].detach()
        return d if d.dim() == 2 else d.sum(dim=tuple(range(1, d.dim() - 1)))


def _per_sample_grads(
    saved: Tensor | _LinearWeightFactors | ConvWeightFactors | None, batch_size: int
) -> MaterializedGrads | FactoredLinearGrads | ConvGrads | None:
    """Wrap BackPACK's ``grad_batch`` (scaled by ``1/B`` for a mean loss), undoing the scaling."""
    if saved is None:
        return None
    if isinstance(saved, ConvWeightFactors):
        return ConvGrads(saved.scaled(batch_size))
    if isinstance(saved, _LinearWeightFactors):
        a, d = saved.inputs, saved.grad_outputs * batch_size
        if a.dim() == 2:
            return FactoredLinearGrads(a, d)
        # inputs with extra axes [B, ..., in]: g_n = sum_t d_nt a_nt^T, materialize
        return MaterializedGrads(torch.einsum("n...o,n...i->noi", d, a))
    return MaterializedGrads(saved.detach() * batch_size)
