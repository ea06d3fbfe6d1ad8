"""The ``hooks`` provider: per-sample gradients from the user's own forward and backward pass.

While armed, a forward hook on every module it serves keeps what the module's rule needs
(usually the layer input) and registers a hook on the module's output tensor; during the
tracked ``backward`` that hook receives the output gradient. A hook on each served
parameter fires once the parameter's gradient of this backward pass is complete, that is
once every use has its output gradient: the rule then forms the parameter's typed
per-sample gradients and the core reduces them to the requested statistics at once
(:meth:`cockpit_core.Collection.deliver`), so nothing is recomputed and a layer's
per-sample gradients never outlive its backward step. Modules whose ``forward`` calls a
functional with the parameters (``nn.MultiheadAttention``) are observed through a
``TorchFunctionMode`` that hands that call to the rule.

The first time a parameter is served after ``attach``, the mean of its per-sample
gradients is compared with the gradient autograd computed for it in the same pass: a
parameter that is also used outside the observed module calls (a functional call in a
parent's ``forward``) is caught there and its statistics are reported missing (with
``backend="auto"`` and a loss, ``torch.func`` then serves it), never silently wrong.

Rules live in :mod:`cockpit_hooks.rules`, one module family per file. A parameter whose
module has no rule (or is registered by several modules) is left to other providers:
``cp.check(model)`` says which, and why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from cockpit_core import Collection, ParamSlot, StatisticProvider
from cockpit_hooks.recording import (
    Intercept,
    Site,
    State,
    gradient_mismatch,
    hook_target,
    mismatch_tolerance,
    sequence_first_modules,
)
from cockpit_hooks.rules import Rule, Use, rule_for


@dataclass
class _Served:
    """How the provider serves one tracked parameter."""

    rule: Rule
    module: torch.nn.Module  # the module whose forward is observed
    owner: torch.nn.Module  # the module that registers the parameter
    attr: str


class HooksProvider(StatisticProvider):
    """Per-sample statistics from module hooks (no extra forward or backward pass).

    Needs the model (``Cockpit(model, ...)`` or ``cp.attach(model)``). Supports the modules
    of :mod:`cockpit_hooks.rules`: ``nn.Linear`` with any leading dimensions,
    ``nn.Embedding``, ``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.GroupNorm``,
    ``nn.Conv1d``/``nn.Conv2d`` and ``nn.MultiheadAttention``.
    """

    name = "hooks"
    cost = 1.0
    description = "module hooks: per-sample gradients within the user's forward and backward pass"
    per_sample = True
    observes_forward = True

    def __init__(self, params: Sequence[torch.nn.Parameter], names: Sequence[str], options=None):
        super().__init__(params, names, options)
        self._served: dict[int, _Served] = {}
        self._reasons: dict[int, str] = {}
        self._handles: dict[torch.nn.Module, list[Any]] = {}
        self._armed: frozenset[int] = frozenset()
        self._state = State()
        self._collection: Collection | None = None
        self._suspended = False
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._verified: set[int] = set()  # mean of per-sample gradients == autograd's
        self._unseen: dict[int, str] = {}  # parameters with uses the hooks do not see
        self._failures: dict[tuple[str, str], dict[str, list[str]]] = {}  # of this step

    # -- routing ------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module, loss_fn: Any = None) -> None:
        """Find the rule of every tracked parameter's module."""
        self.arm(frozenset())
        super().attach(model, loss_fn)
        self._served, self._reasons = {}, {}
        self._verified, self._unseen = set(), {}
        sequence_first = sequence_first_modules(model)
        for module in model.modules():
            rule = rule_for(module)
            if rule is None:
                continue
            why = sequence_first.get(module) or rule.supports(module)
            for owner, attr in rule.owned(module):
                i = self._index.get(id(getattr(owner, attr)))
                if i is None or i in self._served or i in self._reasons:
                    continue  # claimed by an enclosing module (attention's out_proj)
                if why is None:
                    self._served[i] = _Served(rule, module, owner, attr)
                else:
                    self._reasons[i] = f"{type(module).__name__}: {why}"

    def supports(self, slot: ParamSlot, kind: Any) -> str | None:
        """Every per-sample kind, for parameters of modules with a rule."""
        if self.model is None or slot.module is None:
            return "needs the model: pass it to Cockpit(model, ...) or call cp.attach(model)"
        if slot.shared:
            return (
                "the parameter is registered by several modules (tied weights): module hooks "
                "would see only some of its uses"
            )
        if slot.index in self._served:
            return None
        if slot.index in self._reasons:
            return self._reasons[slot.index]
        module = type(slot.module).__name__
        if isinstance(slot.module, torch.nn.modules.batchnorm._BatchNorm):
            return (
                f"no rule for {module}: in training mode BatchNorm mixes the samples of a "
                "batch, so per-sample gradients are not defined"
            )
        return f"no rule for {module}, whose own forward uses its parameter '{slot.attribute}'"

    # -- the forward pass ---------------------------------------------------------------

    def arm(self, indices: frozenset[int]) -> None:
        """Hook the modules of ``indices``; unhook every other module."""
        indices = frozenset(i for i in indices if i in self._served)
        wanted = {self._served[i].module for i in indices}
        for module in list(self._handles):
            if module not in wanted:
                for handle in self._handles.pop(module):
                    handle.remove()
        for module in wanted:
            if module not in self._handles:
                self._handles[module] = self._hook(module)
        self._armed = indices
        if not indices and self._collection is None:
            self._state.clear()

    def armed(self, indices: frozenset[int]) -> bool:  # noqa: D102
        return all(i in self._armed for i in indices if i in self._served)

    def suspended(self) -> contextlib.AbstractContextManager:
        """Ignore forward and backward passes (another provider runs its own)."""
        return _flag(self)

    def close(self) -> None:  # noqa: D102
        self.arm(frozenset())

    def _hook(self, module: torch.nn.Module) -> list[Any]:
        rule = rule_for(module)
        assert rule is not None
        if rule.intercepts is None:

            def on_forward(mod, args, kwargs, output):
                if not self._observing():
                    return
                try:
                    uses = rule.uses(mod, args, kwargs, output)
                except Exception as err:  # never break the user's forward pass
                    self._forward_failed(rule, mod, err)
                    return
                for use in uses:
                    self._record(rule, use)

            return [module.register_forward_hook(on_forward, with_kwargs=True)]
        modes: list[Any] = []

        def enter(mod, args):
            mode = None
            if self._observing():
                mode = Intercept(
                    rule.intercepts, lambda f, a, k: self._intercept(rule, mod, f, a, k)
                )
                mode.__enter__()
            modes.append(mode)

        def leave(mod, args, output):
            mode = modes.pop() if modes else None
            if mode is not None:
                mode.__exit__(None, None, None)

        return [
            module.register_forward_pre_hook(enter),
            module.register_forward_hook(leave, always_call=True),
        ]

    def _intercept(self, rule: Rule, module: torch.nn.Module, func, args, kwargs) -> Any:
        """The rule computes the functional; its uses count only if it ran to the end."""
        uses: list[Use] = []
        try:
            out = rule.intercept(module, uses.append, func, args, kwargs)
        except Exception as err:  # PyTorch's own function then runs (and raises, if it must)
            self._forward_failed(rule, module, err)
            return func(*args, **kwargs)
        for use in uses:
            self._record(rule, use)
        return out

    def _forward_failed(self, rule: Rule, module: torch.nn.Module, err: Exception) -> None:
        for owner, attr in rule.owned(module):
            i = self._index.get(id(getattr(owner, attr)))
            if i is not None and i in self._armed:
                self._state.failed.setdefault(
                    i, f"the rule failed in the forward pass: {type(err).__name__}: {err}"
                )

    def _observing(self) -> bool:
        return not self._suspended and torch.is_grad_enabled()

    def _record(self, rule: Rule, use: Use) -> None:
        output = use.output
        if not isinstance(output, Tensor) or not output.requires_grad:
            return
        params = []
        for owner, attr in use.params:
            i = self._index.get(id(getattr(owner, attr)))
            if i is not None and i in self._armed:
                params.append((i, owner, attr))
        if not params:
            return
        site = Site(rule, params, use.saved)
        target, shape = hook_target(output), output.shape
        if target is output:
            site.handle = output.register_hook(lambda grad, site=site: self._on_grad(site, grad))
        else:
            site.handle = target.register_hook(
                lambda grad, site=site: self._on_grad(site, grad.view(shape))
            )
        self._state.add(site)

    # -- the backward pass --------------------------------------------------------------

    def _on_grad(self, site: Site, grad: Tensor) -> None:
        """A use's output gradient: keep it until its parameters' gradients are complete."""
        if self._suspended:
            return
        if self._collection is None:  # an untracked backward: forget this use
            self._state.forget(site)
            return
        site.grad = grad.detach()
        self._state.live.append(site)

    def _on_param_grad(self, i: int, grad: Tensor) -> None:
        """Parameter ``i``'s gradient of this pass is complete: so are its uses."""
        if not self._suspended and self._collection is not None and i not in self._state.done:
            self._finish(i, grad.detach())

    def _finish(self, i: int, total: Tensor | None) -> None:
        """Form parameter ``i``'s per-sample gradients from its uses and hand them over.

        ``total``: autograd's gradient of the parameter in this pass, to verify the uses
        against (the first time the parameter is served).
        """
        col, state = self._collection, self._state
        state.done.add(i)
        if col is None or i not in col.indices:
            return
        if i in state.failed or i in self._unseen:
            self._fail(col, i, state.failed.get(i) or self._unseen[i])
            return
        sites = [s for s in state.sites_of(i) if s.grad is not None]
        if not sites:
            return  # reported after backward (the hooks saw no use)
        served = self._served[i]
        # a micro-batch of B_k samples of a mean loss over B: rules scale by B_k, so B/B_k
        samples = col.samples or col.batch_size
        factor = col.per_sample_scale / samples  # and over a GradScaler's scale
        pieces = [(s.saved, s.grad if factor == 1 else s.grad * factor) for s in sites]
        try:
            grads = served.rule.per_sample(served.owner, served.attr, pieces, samples)
            if total is not None:
                # autograd's gradient of this pass is the mean of the per-sample gradients
                # (times B_k / B and the loss scale): compare once, then reuse it, so eager
                # projections need no extra contraction ``d^T a`` per layer
                mean = total * (col.per_sample_scale / samples)
                if i not in self._verified:
                    # the coarsest dtype the uses' gradients had (bf16 under autocast)
                    coarse = max((s.grad.dtype for s in sites), key=lambda t: torch.finfo(t).eps)
                    self._verify(i, grads.mean(), mean, coarse)
                grads.mean = lambda mean=mean: mean  # type: ignore[method-assign]
        except Exception as err:  # never break backward(): report the statistic missing
            self._fail(col, i, str(err))
            return
        if i in self._unseen:
            self._fail(col, i, self._unseen[i])
            return
        col.deliver(i, grads)
        for s in sites:  # free what no other parameter still needs
            if all(j in state.done for j, _, _ in s.params):
                s.release()

    def _verify(self, i: int, predicted: Tensor, mean: Tensor, dtype: torch.dtype) -> None:
        """Compare the uses' mean gradient with autograd's; remember a mismatch.

        ``dtype``: the coarsest dtype of the gradients the uses were formed from.
        """
        self._verified.add(i)
        err = gradient_mismatch(predicted, mean)
        coarsest = max((dtype, mean.dtype), key=lambda t: torch.finfo(t).eps)
        if err > mismatch_tolerance(coarsest):
            self._unseen[i] = (
                "the mean of the per-sample gradients from the module "
                f"hooks differs from the parameter's gradient by {err:.3g} (relative): the "
                "parameter is also used outside the calls of its module that the hooks "
                "observe (e.g. by a functional call in a parent module's forward), so the "
                "hooks cannot serve it. With backend='auto' and cp.attach(model, loss_fn), "
                "torch.func computes its statistics."
            )

    def _fail(self, col: Collection, i: int, reason: str) -> None:
        """Parameter ``i`` gets none of its statistics, for ``reason`` (reported after backward)."""
        for stat in col.wanted(i):
            by_reason = self._failures.setdefault(stat.identity, {})
            by_reason.setdefault(reason, []).append(self._label(i))

    def _label(self, i: int) -> str:
        served = self._served.get(i)
        module = type(served.module).__name__ if served is not None else "?"
        return f"'{self.names[i]}' ({module})"

    # -- a tracked step -----------------------------------------------------------------

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Reduce each parameter during ``backward``; the rest (unused outputs) at the end."""
        self._collection, self._failures = collection, {}
        handles = [
            self.params[i].register_hook(lambda grad, i=i: self._on_param_grad(i, grad))
            for i in sorted(collection.indices)
            if i in self._served and self.params[i].requires_grad
        ]
        try:
            yield
            for i in sorted(self._state.by_param):
                if i not in self._state.done and any(
                    s.grad is not None for s in self._state.sites_of(i)
                ):
                    self._finish(i, None)  # e.g. autograd.grad(..., inputs=...) without i
            self._report(collection)
        finally:
            self._failures = {}
            for handle in handles:
                handle.remove()
            self._collection = None
            self._state.clear()

    def _report(self, collection: Collection) -> None:
        """Why statistics are missing: failed parameters, grouped by reason, per statistic.

        A parameter that got a gradient but no statistic had no use the hooks saw.
        """
        for stat in collection.statistics:
            for i in sorted(collection.targets[stat.identity]):
                if (
                    not collection.received(stat, i)
                    and self.params[i].grad is not None
                    and self._label(i) not in _labels(self._failures.get(stat.identity, {}))
                ):
                    self._fail(collection, i, _UNSEEN)
        for stat in collection.statistics:
            groups = self._failures.get(stat.identity)
            if groups:
                collection.fail(
                    stat, "; ".join(f"{', '.join(who)}: {why}" for why, who in groups.items())
                )


_UNSEEN = (
    "the module hooks saw no forward pass of it whose output got a gradient at this step: "
    "run the forward pass after the previous tracked step ended, with gradients enabled "
    "(and call the module itself, not a functional with its parameters)"
)


def _labels(groups: dict[str, list[str]]) -> set[str]:
    return {label for labels in groups.values() for label in labels}


@contextlib.contextmanager
def _flag(provider: HooksProvider) -> Iterator[None]:
    old, provider._suspended = provider._suspended, True
    try:
        yield
    finally:
        provider._suspended = old
