"""Which backend computes which parameter's per-sample statistics, and the merged result.

``backend="backpack"`` uses BackPACK only (Dangel et al., 2020); ``"func"`` computes every
per-sample statistic with ``torch.func`` (:mod:`cockpit_core.backends.func`); ``"auto"``
gives a parameter to BackPACK if the module that owns it is extended and supported by
``BatchGrad``, and to ``torch.func`` otherwise (only once ``cp.attach(model, loss_fn)`` was
called). Curvature diagonals (``diag_hessian``, ``diag_ggn_*``) always come from BackPACK:
their definition needs its second-order backpropagation. Either way a statistic follows
the convention of :mod:`cockpit_core.requirements` (``g_n`` = gradient of ``l_n``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core.backends.backpack import BackpackBackend
from cockpit_core.backends.func import AttachedModel, FuncBackend, batch_length, owning_modules
from cockpit_core.errors import MissingInfoError, MisuseError
from cockpit_core.requirements import MergedRequirements, Statistic

BACKENDS = ("auto", "backpack", "func")
ATTACH_HINT = (
    "cp.attach(model, loss_fn) computes them with torch.func for any model (see docs/any_model.md)."
)
HVP_HINT = (
    "Quantities based on Hessian-vector products (hess_max_ev, hess_trace with "
    "method='hutchinson') work on any model."
)

_SKIP_WARNING = "Extension saving to grad_batch does not have an extension for Module"

Results = dict[tuple[str, str], list[Tensor | None]]


def _label(name: str, module: torch.nn.Module) -> str:
    return f"'{name or type(module).__name__}' ({type(module).__name__})"


class StatisticsRouter:
    """The core's statistics backend: BackPACK, ``torch.func`` or both, per parameter.

    Args:
        params: The tracked parameters.
        param_names: Their names.
        backend: ``"auto"``, ``"backpack"`` or ``"func"``.
        chunk_size: Samples per ``torch.func`` pass (``None``: the whole batch).

    """

    name = "router"

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        param_names: Sequence[str],
        backend: str = "auto",
        chunk_size: int | None = None,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
        self.params = list(params)
        self.param_names = list(param_names)
        self.mode = backend
        self.backpack = BackpackBackend(self.params, self.param_names)
        self.func = FuncBackend(self.params, chunk_size)
        self.attached: AttachedModel | None = None
        self.math_attention = False  # set by Cockpit.attach
        self._routes: list[str] | None = None

    # -- delegation kept for callers that expect a BackpackBackend -------------------------

    def unsupported_modules(self, model: torch.nn.Module, statistic: Statistic) -> list:
        """BackPACK's unsupported modules for ``statistic`` (see :class:`BackpackBackend`)."""
        return self.backpack.unsupported_modules(model, statistic)

    # -- routing ----------------------------------------------------------------------------

    def attach(self, attached: AttachedModel) -> None:
        """Use ``attached`` (model, loss) for the ``torch.func`` path."""
        self.attached = attached
        self._routes = None

    def routes(self) -> list[str]:
        """``"backpack"`` or ``"func"`` per tracked parameter, for per-sample statistics."""
        if self._routes is None:
            self._routes = self._plan(self.attached)
        return self._routes

    def _plan(self, attached: AttachedModel | None, need_extended: bool = True) -> list[str]:
        if self.mode == "func":
            return ["func"] * len(self.params)
        if self.mode == "backpack" or attached is None:
            return ["backpack"] * len(self.params)
        supported = self.backpack.per_sample_modules()
        routes = []
        for _, module in attached.owners:
            ok = supported is not None and type(module) in supported
            if need_extended:
                ok = ok and bool(getattr(module, "_backpack_extend", False))
            routes.append("backpack" if ok else "func")
        return routes

    def needs_hooks(self, merged: MergedRequirements) -> bool:
        """Whether BackPACK's module hooks must be installed for the forward pass of a step."""
        per_sample = any(s.per_sample for s in merged.statistics)
        curvature = any(not s.per_sample for s in merged.statistics)
        return curvature or (per_sample and "backpack" in self.routes())

    # -- the step ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def collect(
        self, merged: MergedRequirements, batch_size: int, info: Mapping[str, Any] | None = None
    ) -> Iterator[tuple[Results, dict[tuple[str, str], str]]]:
        """Run the user's backward inside; statistics are complete after the block.

        BackPACK fills its parameters during ``backward``; the ``torch.func`` pass runs on
        exit, from ``info["inputs"]`` and ``info["targets"]`` and the attached model and loss.

        Yields:
            ``(statistics, missing)`` as :meth:`BackpackBackend.collect`.

        """
        info = info or {}
        per_sample = [s for s in merged.statistics if s.per_sample]
        routes = self.routes()
        use_func = bool(per_sample) and "func" in routes
        if use_func:
            self._check_func_ready(info, batch_size)
        bp_stats = [s for s in merged.statistics if not s.per_sample]
        if per_sample and "backpack" in routes:
            bp_stats = per_sample + bp_stats
        results: Results = {s.identity: [None] * len(self.params) for s in merged.statistics}
        missing: dict[tuple[str, str], str] = {}
        bp_results: Results = {}
        bp_missing: dict[tuple[str, str], str] = {}
        with contextlib.ExitStack() as stack:
            if use_func and "backpack" in routes:  # torch.func covers what BackPACK skips
                stack.enter_context(warnings.catch_warnings())
                warnings.filterwarnings("ignore", message=_SKIP_WARNING)
            if bp_stats:
                idents = {s.identity for s in bp_stats}
                bp_merged = MergedRequirements(
                    statistics=tuple(s for s in merged.statistics if s.identity in idents),
                    owners={k: v for k, v in merged.owners.items() if k in idents},
                    loss_graph=merged.loss_graph,
                )
                bp_results, bp_missing = stack.enter_context(
                    self.backpack.collect(bp_merged, batch_size)
                )
            yield results, missing
        for ident, values in bp_results.items():
            results[ident][:] = values
        failures = self._run_func(per_sample, routes, results, info) if per_sample else {}
        missing.update(self._missing(merged.statistics, results, bp_missing, failures))

    def _check_func_ready(self, info: Mapping[str, Any], batch_size: int) -> None:
        if self.attached is None:
            raise MisuseError(
                "backend='func' computes per-sample statistics with torch.func and needs the "
                "model and a per-sample loss: call cp.attach(model, loss_fn) before training, "
                "e.g. cp.attach(model, torch.nn.CrossEntropyLoss(reduction='none'))."
            )
        if "inputs" not in info:
            owners = ", ".join(
                sorted(
                    {
                        _label(*self.attached.owners[i])
                        for i, r in enumerate(self.routes())
                        if r == "func"
                    }
                )
            )
            raise MissingInfoError(
                "Per-sample statistics of the attached model are computed with torch.func "
                f"(for {owners}), which needs the batch: pass info={{'inputs': x, 'targets': "
                "y, ...}} to cp(step, info=...)."
            )
        n = batch_length(info["inputs"])
        if n != batch_size:
            raise MisuseError(
                f"info['inputs'] holds {n} samples but the batch size is {batch_size}: pass "
                "the inputs of the mini-batch whose loss is backpropagated."
            )

    def _run_func(
        self,
        per_sample: list[Statistic],
        routes: list[str],
        results: Results,
        info: Mapping[str, Any],
    ) -> dict[tuple[str, str], str]:
        """Fill the parameters routed to ``torch.func`` and those BackPACK left empty."""
        if self.attached is None or "inputs" not in info:
            return {}
        todo = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            lacking = any(results[s.identity][i] is None for s in per_sample)
            # "auto": a BackPACK parameter that got nothing (e.g. a module used twice)
            if routes[i] == "func" or (lacking and self.mode == "auto"):
                todo.append(i)
        if not todo:
            return {}
        values, failures = self.func.compute(
            self.attached, todo, per_sample, info["inputs"], info.get("targets")
        )
        for ident, by_param in values.items():
            for i, value in by_param.items():
                results[ident][i] = value
        return failures

    def _missing(
        self,
        statistics: Sequence[Statistic],
        results: Results,
        bp_missing: Mapping[tuple[str, str], str],
        failures: Mapping[tuple[str, str], str],
    ) -> dict[tuple[str, str], str]:
        out = {}
        for stat in statistics:
            ident = stat.identity
            lacking = [
                self.param_names[i]
                for i, p in enumerate(self.params)
                if results[ident][i] is None and p.grad is not None
            ]
            if not stat.per_sample:
                if ident in bp_missing:
                    out[ident] = bp_missing[ident]
                continue
            if not lacking:
                continue
            if ident in failures:
                where = ", ".join(f"'{n}'" for n in lacking)
                out[ident] = f"{failures[ident]} No {stat.describe()} for parameter(s) {where}."
            elif ident in bp_missing:
                hint = (
                    f" Or: {ATTACH_HINT}"
                    if self.attached is None
                    else (" The torch.func path needs info['inputs'] (and info['targets']).")
                )
                out[ident] = bp_missing[ident] + hint
            else:
                where = ", ".join(f"'{n}'" for n in lacking)
                out[ident] = f"No {stat.describe()} was computed for parameter(s) {where}."
        return out

    # -- coverage (cp.check) ----------------------------------------------------------------

    def coverage(self, model: torch.nn.Module, stat: Statistic) -> tuple[str, str, str]:
        """``(how, problem, hint)`` for computing ``stat`` on ``model`` (``problem`` empty: ok)."""
        if not stat.per_sample:
            how = f"BackPACK {_BACKPACK_NAMES[stat.kind]}"
            bad = self.backpack.unsupported_modules(model, stat)
            if not bad:
                return how, "", ""
            mods = ", ".join(f"'{n}' ({c})" for n, c in bad)
            return how, f"{how} does not support {mods}", HVP_HINT
        found = owning_modules(model)
        owners = {i: found[id(p)] for i, p in enumerate(self.params) if id(p) in found}
        supported = self.backpack.per_sample_modules() or set()
        unsupported = list(
            dict.fromkeys(_label(*o) for o in owners.values() if type(o[1]) not in supported)
        )
        attached = self.attached is not None and self.attached.model is model
        if self.mode == "func":
            if attached:
                return "torch.func", "", ""
            return "torch.func", "backend='func' needs cp.attach(model, loss_fn)", ""
        if self.mode == "backpack" or not attached:
            if not unsupported:
                return "BackPACK BatchGrad", "", ""
            hint = ATTACH_HINT if self.mode == "auto" else f"backend='auto' with {ATTACH_HINT}"
            return (
                "BackPACK BatchGrad",
                f"BackPACK BatchGrad does not support {', '.join(unsupported)}",
                hint,
            )
        routes = self.routes()
        if "func" not in routes:
            return "BackPACK BatchGrad", "", ""
        if "backpack" not in routes:
            return "torch.func", "", ""
        func_owners = sorted({_label(*o) for i, o in owners.items() if routes[i] == "func"})
        return f"BackPACK BatchGrad, torch.func for {', '.join(func_owners)}", "", ""


_BACKPACK_NAMES = {
    "diag_hessian": "DiagHessian",
    "diag_ggn_exact": "DiagGGNExact",
    "diag_ggn_mc": "DiagGGNMC",
}
