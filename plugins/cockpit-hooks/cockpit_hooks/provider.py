"""The ``hooks`` provider: per-sample gradients from the user's own forward and backward pass.

While armed, a forward hook on every module it serves keeps what the module's rule needs
(usually the layer input) and registers a hook on the module's output tensor; during the
tracked ``backward`` that hook receives the output gradient. A hook on each served
parameter fires once the parameter's gradient of this backward pass is complete, that is
once every use has its output gradient: the rules then form the parameter's typed
per-sample gradients (summed over its modules for tied weights) and the core reduces them
to the requested statistics at once (:meth:`cockpit_core.Collection.deliver`), so nothing
is recomputed and a layer's per-sample gradients never outlive its backward step. Modules
whose ``forward`` calls a functional with the parameters (``nn.MultiheadAttention``) are
observed through a ``TorchFunctionMode`` that hands that call to the rule.

During the root module's forward pass a :class:`~cockpit_hooks.broadcast.BroadcastMode`
captures per-sample gradients where a tensor is broadcast into the batch: a module that
ran once for the whole batch (positions looked up once) and the parameters a module uses
directly in its ``forward`` (a ViT's ``cls`` token, an RMSNorm's ``weight * x``). Direct
parameters used otherwise go to the generic rule, which re-runs their module alone per
sample (:mod:`cockpit_hooks.rules.generic`).

Sharded parameters (FSDP2's ``fully_shard``): the model holds each tracked parameter as a
``DTensor`` shard, and during its module's forward and backward FSDP puts the gathered,
unsharded tensor in its place (``module._parameters[attr]``). The hooks find the tracked
parameter by where it is registered (module and attribute) instead of by identity, form
the per-sample gradients of the whole (unsharded) layer from this process's samples, and
hook that unsharded tensor for the end of its gradient; the core combines the processes'
statistics (:mod:`cockpit_core.distributed.sharded`).

Per-sample gradients are checked against the gradient autograd computed in the same pass
(the first time a rule serves a parameter; at every step for direct parameters and
broadcast outputs): a parameter also used where the hooks do not see it is reported
missing with the reason (with ``backend="auto"`` and a loss, ``torch.func`` then serves
it), never silently wrong.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from cockpit_core import (
    Collection,
    DenseGrads,
    ParamSlot,
    PerSampleGrads,
    StatisticProvider,
    TiedGrads,
)
from cockpit_hooks.broadcast import BroadcastMode, Origin
from cockpit_hooks.recording import (
    Intercept,
    Site,
    State,
    gradient_mismatch,
    hook_target,
    mismatch_tolerance,
)
from cockpit_hooks.rules import FUNCTIONAL, Rule, Use
from cockpit_hooks.rules.base import Unsupported
from cockpit_hooks.rules.functional import FunctionalCall
from cockpit_hooks.servings import Servings, find_servings
from cockpit_hooks.sharded import DTensor


class HooksProvider(StatisticProvider):
    """Per-sample statistics from module hooks (no extra forward or backward pass).

    Needs the model (``Cockpit(model, ...)`` or ``cp.attach(model)``). Serves the modules
    of :mod:`cockpit_hooks.rules` (``nn.Linear``, ``transformers``' ``Conv1D``,
    ``nn.Embedding``, normalization layers, BatchNorm in eval mode, convolutions,
    ``nn.MultiheadAttention``), tied weights, tensors broadcast into the batch, and any
    other module's own parameters through the generic rule.
    """

    name = "hooks"
    cost = 1.0
    description = "module hooks: per-sample gradients within the user's forward and backward pass"
    per_sample = True
    observes_forward = True

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        options: Mapping[str, Any] | None = None,
    ):
        super().__init__(params, names, options)
        self._servings = Servings()
        self._module_names: dict[torch.nn.Module, str] = {}
        self._handles: dict[torch.nn.Module, list[Any]] = {}
        self._root_handles: list[Any] = []
        self._modes: list[BroadcastMode | None] = []  # one per root forward being run
        self._armed: frozenset[int] = frozenset()
        self._state = State()
        self._origins: dict[int, list[Origin]] = {}  # direct parameters, per forward pass
        self._captured: dict[int, Tensor] = {}  # their per-sample gradients of this pass
        self._collection: Collection | None = None
        self._suspended = False
        self._index = {id(p): i for i, p in enumerate(self.params)}
        # FSDP2: (id(module), attr) of each tracked DTensor, and the unsharded tensor FSDP
        # puts there during forward and backward, with its gradient hook while collecting
        self._sharded: dict[tuple[int, str], int] = {}
        self._stand_ins: dict[int, Tensor] = {}
        self._stand_in_hooks: dict[int, Any] = {}
        self._verified: dict[int, str] = {}  # how it was served when the mean was compared
        self._unseen: dict[int, str] = {}  # parameters with uses the hooks do not see
        self._how: dict[int, str] = {}  # how each direct parameter was served last
        self._failures: dict[tuple[str, str], dict[str, list[str]]] = {}  # of this step

    # -- routing ------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module, loss_fn: Any = None) -> None:
        """Find the rules of every tracked parameter's modules."""
        self.arm(frozenset())
        super().attach(model, loss_fn)
        self._servings = find_servings(model, self._index)
        self._module_names = {m: n for n, m in model.named_modules(remove_duplicate=False)}
        self._sharded = {
            (id(module), attr): self._index[id(p)]
            for module in model.modules()
            for attr, p in module.named_parameters(recurse=False)
            if id(p) in self._index and isinstance(p, DTensor)
        }
        self._verified, self._unseen, self._how = {}, {}, {}

    def supports(self, slot: ParamSlot, kind: Any) -> str | None:
        """Every per-sample kind, for parameters a rule or a broadcast capture can serve."""
        if self.model is None or slot.module is None:
            return "needs the model: pass it to Cockpit(model, ...) or call cp.attach(model)"
        if self._servings.serves(slot.index):
            return None
        if slot.index in self._servings.reasons:
            return self._servings.reasons[slot.index]
        return f"no rule for {type(slot.module).__name__}"

    def describe(self, slot: ParamSlot) -> str:
        """How ``slot`` is served: ``"Linear rule"``, ``"Embedding + Linear rules (tied: ...)"``.

        After a tracked step, what served it at that step (e.g. where a broadcast was
        captured); before, what will try.
        """
        i = slot.index
        if i in self._how:
            return self._how[i]
        if i in self._servings.rules:
            return self.describe_rules(i)
        direct = self._servings.direct.get(i)
        if direct is None:
            return ""
        text = f"captured where {type(direct.module).__name__}.forward broadcasts it"
        if direct.generic is not None:
            text += f", else the {direct.generic.rule.name(direct.module)}"
        return text

    def describe_rules(self, i: int) -> str:
        """The dedicated rules of parameter ``i``, with the modules of tied weights."""
        uses = self._servings.rules[i]
        names = list(dict.fromkeys(s.rule.name(s.module) for s in uses))
        if len(uses) == 1:
            return names[0]
        modules = ", ".join(f"'{self._module_names.get(s.module, '?')}'" for s in uses)
        return f"{' + '.join(n.removesuffix(' rule') for n in names)} rules (tied: {modules})"

    # -- the forward pass ---------------------------------------------------------------

    def arm(self, indices: frozenset[int]) -> None:
        """Hook the modules of ``indices`` (and the model, for broadcasts); unhook the rest."""
        indices = frozenset(i for i in indices if self._servings.serves(i))
        wanted = {m for i in indices for m in self._servings.modules(i)}
        for module in list(self._handles):
            if module not in wanted:
                for handle in self._handles.pop(module):
                    handle.remove()
        for module in wanted:
            if module not in self._handles:
                self._handles[module] = self._hook(module)
        if indices and not self._root_handles and self.model is not None:
            self._root_handles = [
                self.model.register_forward_pre_hook(self._enter_root, with_kwargs=True),
                self.model.register_forward_hook(self._leave_root, always_call=True),
            ]
        elif not indices:
            for handle in self._root_handles:
                handle.remove()
            self._root_handles = []
        self._armed = indices
        if not indices and self._collection is None:
            self._clear()

    def armed(self, indices: frozenset[int]) -> bool:  # noqa: D102
        return all(i in self._armed for i in indices if self._servings.serves(i))

    def suspended(self) -> contextlib.AbstractContextManager[None]:
        """Ignore forward and backward passes (another provider runs its own)."""
        return _flag(self)

    def close(self) -> None:  # noqa: D102
        self.arm(frozenset())

    def _observing(self) -> bool:
        return not self._suspended and torch.is_grad_enabled()

    def _enter_root(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """The model's forward begins: capture broadcasts into its batch."""
        mode = None
        batch = _batch_of(args, kwargs)
        if self._observing() and batch is not None:
            mode = BroadcastMode(batch, self._on_functional)
            for i in sorted(self._armed):
                if i in self._servings.direct:
                    receive = lambda g, i=i: self._on_direct(i, g)  # noqa: E731
                    origin = Origin(self.params[i].shape, receive, key=i)
                    self._origins.setdefault(i, []).append(origin)
                    mode.track(self.params[i], origin)
            mode.__enter__()  # type: ignore[no-untyped-call]  # unannotated in torch
        self._modes.append(mode)

    def _leave_root(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        mode = self._modes.pop() if self._modes else None
        if mode is not None:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # as __enter__
            mode.release()

    def _hook(self, module: torch.nn.Module) -> list[Any]:
        rule = self._servings.rule_of(module)
        assert rule is not None
        intercepts = rule.intercepts
        if intercepts is None:

            def on_forward(
                mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
            ) -> None:
                if not self._observing():
                    return
                try:
                    uses = rule.uses(mod, args, kwargs, output)
                except Exception as err:  # never break the user's forward pass
                    self._forward_failed(rule, mod, err)
                    return
                for use in uses:
                    self._record(rule, mod, use)

            return [module.register_forward_hook(on_forward, with_kwargs=True)]
        modes: list[Intercept | None] = []

        def enter(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
            mode = None
            if self._observing():
                mode = Intercept(intercepts, lambda f, a, k: self._intercept(rule, mod, f, a, k))
                mode.__enter__()  # type: ignore[no-untyped-call]  # unannotated in torch
            modes.append(mode)

        def leave(mod: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            mode = modes.pop() if modes else None
            if mode is not None:
                mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # as __enter__

        return [
            module.register_forward_pre_hook(enter),
            module.register_forward_hook(leave, always_call=True),
        ]

    def _intercept(
        self,
        rule: Rule,
        module: torch.nn.Module,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The rule computes the functional; its uses count only if it ran to the end."""
        uses: list[Use] = []
        try:
            out = rule.intercept(module, uses.append, func, args, kwargs)
        except Exception as err:  # PyTorch's own function then runs (and raises, if it must)
            self._forward_failed(rule, module, err)
            return func(*args, **kwargs)
        for use in uses:
            self._record(rule, module, use)
        return out

    def _forward_failed(self, rule: Rule, module: torch.nn.Module, err: Exception) -> None:
        why = str(err)
        if not isinstance(err, Unsupported):
            why = f"the rule failed in the forward pass: {type(err).__name__}: {err}"
        for owner, attr in rule.owned(module):
            i = self._index_of(owner, attr)
            if i is not None and i in self._armed:
                self._state.failed.setdefault(i, why)

    def _record(self, rule: Rule, module: torch.nn.Module, use: Use) -> None:
        output = use.output
        if not isinstance(output, Tensor) or not output.requires_grad:
            return
        params = []
        for owner, attr in use.params:
            i = self._index_of(owner, attr)
            if i is not None and i in self._armed:
                params.append((i, owner, attr))
        if not params:
            return
        site = Site(rule, module, params, use.saved, output.shape)
        self._hook_output(site, output)
        mode = self._modes[-1] if self._modes else None
        if mode is not None and mode.batch_size > 1:  # the output may be broadcast over it
            receive = lambda g, site=site: self._on_broadcast(site, g)  # noqa: E731
            mode.track(output, Origin(output.shape, receive))
        self._state.add(site)

    def _index_of(self, owner: torch.nn.Module, attr: str) -> int | None:
        """The tracked index of ``owner.attr`` now, or ``None`` if it is not tracked.

        Under FSDP2 it is the unsharded tensor standing in for a tracked ``DTensor``: noted,
        so that its gradient's end is hooked (:meth:`_hook_stand_in`).
        """
        tensor = getattr(owner, attr)
        i = self._index.get(id(tensor))
        if i is None and self._sharded:
            i = self._sharded.get((id(owner), attr))
            if i is not None and isinstance(tensor, Tensor) and not isinstance(tensor, DTensor):
                if self._stand_ins.get(i) is not tensor:
                    self._stand_ins[i] = tensor
                    self._hook_stand_in(i)
        return i

    def _hook_stand_in(self, i: int) -> None:
        """While collecting: hook the end of the unsharded stand-in's gradient (FSDP2)."""
        tensor = self._stand_ins.get(i)
        if self._collection is None or tensor is None or not tensor.requires_grad:
            return
        old = self._stand_in_hooks.pop(i, None)
        if old is not None:
            old.remove()
        self._stand_in_hooks[i] = tensor.register_hook(
            lambda grad, i=i: self._on_param_grad(i, grad)
        )

    def _hook_output(self, site: Site, output: Tensor) -> None:
        """Receive the gradient of ``output`` for ``site`` during ``backward``."""
        target, shape = hook_target(output), output.shape
        if target is output:
            site.handle = output.register_hook(lambda grad, site=site: self._on_grad(site, grad))
        else:
            site.handle = target.register_hook(
                lambda grad, site=site: self._on_grad(site, grad.view(shape))
            )

    def _on_functional(
        self, call: FunctionalCall, roles: dict[str, Origin], output: Tensor
    ) -> bool:
        """Record a functional call with direct parameters (one site per module)."""
        if not output.requires_grad:
            return False
        by_module: dict[torch.nn.Module, list[tuple[int, str, str]]] = {}
        for role, origin in roles.items():
            direct = None if origin.key is None else self._servings.direct.get(origin.key)
            if direct is None or origin.key is None:  # not a direct parameter
                return False
            by_module.setdefault(direct.module, []).append((origin.key, direct.attr, role))
        for module, params in by_module.items():
            saved = call.detached()
            saved.roles = {attr: role for _, attr, role in params}
            site = Site(
                FUNCTIONAL, module, [(i, module, a) for i, a, _ in params], saved, output.shape
            )
            self._hook_output(site, output)
            self._state.add(site)
        return True

    # -- the backward pass --------------------------------------------------------------

    def _on_grad(self, site: Site, grad: Tensor) -> None:
        """A use's output gradient: keep it until its parameters' gradients are complete."""
        if self._suspended:
            return
        if self._collection is None:  # an untracked backward: forget this use
            self._state.forget(site)
            return
        site.grad = grad.detach() if site.grad is None else site.grad + grad.detach()
        if not site.broadcast:
            self._state.live.append(site)

    def _on_broadcast(self, site: Site, per_sample: Tensor) -> None:
        """Per-sample gradients of a use's output, captured where it was broadcast."""
        if self._suspended or self._collection is None:
            return
        if site.per_sample is None:
            site.per_sample = per_sample.detach()
            self._state.live.append(site)
        else:
            site.per_sample = site.per_sample + per_sample.detach()

    def _on_direct(self, i: int, per_sample: Tensor) -> None:
        """Per-sample gradients of a direct parameter, captured where it was broadcast."""
        if self._suspended or self._collection is None:
            return
        previous = self._captured.get(i)
        self._captured[i] = per_sample.detach() if previous is None else previous + per_sample

    def _on_param_grad(self, i: int, grad: Tensor) -> None:
        """Parameter ``i``'s gradient of this pass is complete: so are its uses."""
        if not self._suspended and self._collection is not None and i not in self._state.done:
            self._finish(i, grad.detach())

    def _finish(self, i: int, total: Tensor | None) -> None:
        """Form parameter ``i``'s per-sample gradients from its uses and hand them over.

        ``total``: autograd's gradient of the parameter in this pass, to verify the uses
        against.
        """
        col, state = self._collection, self._state
        state.done.add(i)
        if col is None or i not in col.indices:
            return
        direct = i in self._servings.direct  # a failed generic call may not be needed
        if (i in state.failed and not direct) or i in self._unseen:
            self._fail(col, i, state.failed.get(i) or self._unseen[i])
            return
        samples = col.samples or col.batch_size
        try:
            formed = self._per_sample(i, col, samples)
            if formed is None:
                return  # reported after backward (the hooks saw no use)
            grads, how = formed
            if total is not None and (col.eager or self._verified.get(i) != how):
                # autograd's gradient of this pass is the mean of the per-sample gradients
                # (times B_k / B and the loss scale): compare whenever the parameter is
                # served another way than at the last comparison, then reuse it, so eager
                # projections need no extra contraction ``d^T a`` per layer
                mean = total * (col.per_sample_scale / samples)
                if self._verified.get(i) != how:
                    dtype = self._coarsest(i, total)
                    floor = self._rounding_floor(i, dtype) * col.per_sample_scale / samples
                    self._verify(i, how, grads.mean(), mean, dtype, floor)
                if col.eager:  # projected now: deferred forms would keep a layer-sized copy
                    # an instance's method replaced by a closure: not expressible in the types
                    grads.mean = lambda mean=mean: mean  # type: ignore[method-assign,misc]
        except Exception as err:  # never break backward(): report the statistic missing
            self._fail(col, i, str(err))
            return
        if i in self._unseen:
            self._fail(col, i, self._unseen[i])
            return
        col.deliver(i, grads)
        for s in state.sites_of(i):  # free what no other parameter still needs
            if all(j in state.done for j, _, _ in s.params):
                s.release()

    def _per_sample(
        self, i: int, col: Collection, samples: int
    ) -> tuple[PerSampleGrads, str] | None:
        """Parameter ``i``'s per-sample gradients, and how they were formed (:meth:`describe`).

        ``None`` when the backward pass reached none of its uses.
        """
        factor = col.per_sample_scale / samples  # rules scale by B_k: B / B_k, / loss scale
        sites = [s for s in self._state.sites_of(i) if s.complete]
        direct = self._servings.direct.get(i)
        if direct is not None:
            origins = self._origins.get(i, [])
            others = sorted({u for o in origins for u in o.other_uses})
            if not others:
                return self._direct_per_sample(i, col, sites, samples, factor)
            if direct.generic is None:
                raise ValueError(_direct_use_message(direct.module, direct.attr, others))
            if i in self._state.failed:  # the generic rule could not record the call
                raise ValueError(self._state.failed[i])
            servings = [direct.generic]
        else:
            servings = self._servings.rules[i]
        parts = []
        for serving in servings:
            pieces = [
                self._piece(s, serving.rule, samples, factor)
                for s in sites
                if s.module is serving.module and s.rule is serving.rule
            ]
            if pieces:
                parts.append(serving.rule.per_sample(serving.owner, serving.attr, pieces, samples))
        if not parts:
            return None
        if direct is not None:
            how = direct.generic.rule.name(direct.module)  # type: ignore[union-attr]
        elif any(s.broadcast for s in sites):
            how = f"{self.describe_rules(i)}, its output captured where broadcast into the batch"
        else:
            how = self.describe_rules(i)
        self._how[i] = how
        return (parts[0] if len(parts) == 1 else TiedGrads(parts)), how

    def _direct_per_sample(
        self, i: int, col: Collection, sites: list[Site], samples: int, factor: float
    ) -> tuple[PerSampleGrads, str] | None:
        """A direct parameter whose every use was captured: at broadcasts, in functionals."""
        direct = self._servings.direct[i]
        parts: list[PerSampleGrads] = []
        how = []
        captured = self._captured.get(i)
        if captured is not None:
            parts.append(DenseGrads(captured * col.per_sample_scale))
            ops = sorted({op for o in self._origins.get(i, []) for op in o.broadcast_at})
            how.append(f"captured where broadcast into the batch ({', '.join(ops)})")
        calls = [s for s in sites if s.rule is FUNCTIONAL]
        if calls:
            pieces = [self._piece(s, FUNCTIONAL, samples, factor) for s in calls]
            parts.append(FUNCTIONAL.per_sample(direct.module, direct.attr, pieces, samples))
            names = sorted({f"F.{s.saved.name}" for s in calls})
            how.append(f"functional rule ({', '.join(names)})")
        if not parts:
            return None
        self._how[i] = " + ".join(how)
        return (parts[0] if len(parts) == 1 else TiedGrads(parts)), self._how[i]

    def _piece(self, site: Site, rule: Rule, samples: int, factor: float) -> tuple[Any, Tensor]:
        """``(saved, output gradient)`` of one use for its rule, scaled to the micro-batch."""
        per_sample = site.per_sample
        if per_sample is None:  # not broadcast: the output's gradient completed the use
            assert site.grad is not None, "only complete sites are pieces"
            return site.saved, site.grad if factor == 1 else site.grad * factor
        if site.grad is not None:  # the total: every use of the output was a broadcast?
            err = gradient_mismatch(per_sample.sum(0), site.grad)
            if err > mismatch_tolerance(per_sample.dtype):
                raise ValueError(
                    f"the output of {type(site.module).__name__} was broadcast over the batch "
                    "and also used in a way the hooks cannot split per sample (relative "
                    f"difference {err:.3g})"
                )
        added = not (len(site.shape) > 0 and site.shape[0] == 1)
        if not added:  # [B, 1, ...] -> [B, ...]: the output's dimension 0 was the broadcast one
            per_sample = per_sample.reshape(per_sample.shape[0], *site.shape[1:])
        return rule.broadcast(site.saved, samples, added), per_sample * factor

    def _coarsest(self, i: int, total: Tensor) -> torch.dtype:
        """The coarsest dtype parameter ``i``'s uses' gradients had (bf16 under autocast)."""
        dtypes = [s.grad.dtype for s in self._state.sites_of(i) if s.grad is not None]
        return max([total.dtype, *dtypes], key=lambda t: torch.finfo(t).eps)

    def _rounding_floor(self, i: int, dtype: torch.dtype) -> float:
        """A bound on the rounding error of parameter ``i``'s gradient, summed over its uses.

        A use's gradient contribution sums ``d_r a_r^T`` (or ``d_r``) over the rows ``r``
        (samples, positions) of its output gradient ``d`` and saved input ``a``: its
        rounding error is at most ``eps ||d||_F ||a||_F`` (``sqrt(rows)`` for ``||a||_F``
        when the rule saved no tensor). A gradient that small is rounding noise, e.g. a key
        projection's bias in softmax attention, whose gradient is zero in exact arithmetic
        (BERT's ``key.bias``): two summation orders then differ by a large relative amount.
        """
        eps, floor = torch.finfo(dtype).eps, 0.0
        for site in self._state.sites_of(i):
            if site.grad is None or site.grad.dim() == 0:
                continue
            rows = site.grad.numel() // max(1, site.grad.shape[-1])
            saved = site.saved
            if isinstance(saved, Tensor) and saved.is_floating_point() and saved.numel():
                size = float(torch.linalg.vector_norm(saved.detach(), dtype=torch.float64))
            else:
                size = math.sqrt(rows)
            floor += eps * float(torch.linalg.vector_norm(site.grad, dtype=torch.float64)) * size
        return floor

    def _verify(
        self,
        i: int,
        how: str,
        predicted: Tensor,
        mean: Tensor,
        dtype: torch.dtype,
        floor: float = 0.0,
    ) -> None:
        """Compare the uses' mean gradient with autograd's; remember a mismatch.

        ``how``: how the parameter was served (see :meth:`describe`); ``dtype``: the
        coarsest dtype of the gradients the uses were formed from; ``floor``: differences
        below it are rounding (:meth:`_rounding_floor`).
        """
        self._verified[i] = how
        err = gradient_mismatch(predicted, mean)
        if err > mismatch_tolerance(dtype) and float((predicted.to(mean) - mean).norm()) > floor:
            self._unseen[i] = (
                "the mean of the per-sample gradients from the module hooks differs from the "
                f"parameter's gradient by {err:.3g} (relative): the parameter is also used "
                "outside the calls of its modules that the hooks observe (e.g. by a "
                "functional call in a parent module's forward), or its module mixes the "
                "samples of the batch, so the hooks cannot serve it. With backend='auto' and "
                "cp.attach(model, loss_fn), torch.func computes its statistics."
            )

    def _fail(self, col: Collection, i: int, reason: str) -> None:
        """Parameter ``i`` gets none of its statistics, for ``reason`` (reported after backward)."""
        for stat in col.wanted(i):
            by_reason = self._failures.setdefault(stat.identity, {})
            by_reason.setdefault(reason, []).append(self._label(i))

    def _label(self, i: int) -> str:
        servings = self._servings
        if i in servings.rules:
            module = type(servings.rules[i][0].module).__name__
        elif i in servings.direct:
            module = type(servings.direct[i].module).__name__
        else:
            module = "?"
        return f"'{self.names[i]}' ({module})"

    # -- a tracked step -----------------------------------------------------------------

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Reduce each parameter during ``backward``; the rest (unused outputs) at the end."""
        self._collection, self._failures = collection, {}
        handles = [
            self.params[i].register_hook(lambda grad, i=i: self._on_param_grad(i, grad))
            for i in sorted(collection.indices)
            if self._servings.serves(i) and self.params[i].requires_grad
        ]
        for i in list(self._stand_ins):  # FSDP2: seen in a forward pass before the block
            self._hook_stand_in(i)
        try:
            yield
            pending = set(self._state.by_param) | set(self._captured) | set(self._origins)
            for i in sorted(pending):
                if i not in self._state.done:
                    self._finish(i, None)  # e.g. autograd.grad(..., inputs=...) without i
            self._report(collection)
        finally:
            self._failures = {}
            for handle in [*handles, *self._stand_in_hooks.values()]:
                handle.remove()
            self._collection, self._stand_in_hooks, self._stand_ins = None, {}, {}
            self._clear()

    def _clear(self) -> None:
        self._state.clear()
        self._origins, self._captured = {}, {}

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
                    self._fail(collection, i, self._unseen_reason(i))
        for stat in collection.statistics:
            groups = self._failures.get(stat.identity)
            if groups:
                collection.fail(
                    stat, "; ".join(f"{', '.join(who)}: {why}" for why, who in groups.items())
                )

    def _unseen_reason(self, i: int) -> str:
        direct = self._servings.direct.get(i)
        if direct is not None and direct.generic is None:
            return (
                f"no broadcast of it into the batch was seen in {type(direct.module).__name__}"
                ".forward: the hooks capture a parameter the model uses directly where an "
                "elementwise operation (+, -, *, /, expand) broadcasts it over the batch; use "
                "it in a module (e.g. nn.Linear), or let torch.func serve it "
                "(cp.attach(model, loss_fn))"
            )
        return _UNSEEN


_UNSEEN = (
    "the module hooks saw no forward pass of it whose output got a gradient at this step: "
    "run the forward pass after the previous tracked step ended, with gradients enabled "
    "(and call the module itself, not a functional with its parameters)"
)


def _direct_use_message(module: torch.nn.Module, attr: str, uses: list[str]) -> str:
    return (
        f"{type(module).__name__}.forward uses its parameter '{attr}' in {', '.join(uses)}, "
        "where the per-sample gradients cannot be separated (module hooks capture a "
        "parameter the model uses directly only where an elementwise operation broadcasts "
        "it into the batch); move that computation into a module (e.g. nn.Linear), or let "
        "torch.func serve it (cp.attach(model, loss_fn))"
    )


def _batch_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The batch size of a forward call: dimension 0 of its first tensor argument."""
    for t in tree_flatten((args, kwargs))[0]:
        if isinstance(t, Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return None


def _labels(groups: dict[str, list[str]]) -> set[str]:
    return {label for labels in groups.values() for label in labels}


@contextlib.contextmanager
def _flag(provider: HooksProvider) -> Iterator[None]:
    old, provider._suspended = provider._suspended, True
    try:
        yield
    finally:
        provider._suspended = old
