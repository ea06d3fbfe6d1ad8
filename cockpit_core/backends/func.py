"""Per-sample statistics of any model with ``torch.func`` (no BackPACK support needed).

The per-sample gradient ``g_n = grad_theta l_n(theta)`` of sample ``n``'s own loss is
computed by vectorizing a one-sample gradient over the batch,
``vmap(grad(l), in_dims=(None, 0, 0))`` with ``l(theta, x_n, y_n)`` evaluated by
``functional_call`` on a batch of one (Horace He and Richard Zou, 2021, "functorch: JAX-like
composable function transforms for PyTorch"; the per-sample-gradient recipe of the PyTorch
documentation). It runs after the user's ``backward`` on the attached model, inputs and
per-sample loss, chunk by chunk over the batch, and reduces each chunk to the statistics
per parameter at once (Dangel et al., 2020, BackPACK, define the same statistics):

    batch_l2:          ||g_n||^2                   (per sample, [B])
    sum_grad_squared:  sum_n g_n * g_n             (parameter shape)
    batch_dot:         g_n . g_m                   ([B, B])
    batch_projection:  g_n . g                     ([B], g: the final mini-batch gradient)
    grad_batch:        g_n                         ([B, *shape])
    transform:         fn([g_1, ..., g_B], theta)

Memory: ``batch_l2`` and ``sum_grad_squared`` keep one chunk of per-sample gradients
(``chunk_size x D``); ``batch_dot``, ``batch_projection``, ``grad_batch`` and transforms need every sample of a
parameter at once and keep ``B x D`` values, like BackPACK.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_map

from cockpit_core.errors import MisuseError
from cockpit_core.requirements import Statistic

FUNC_KINDS = frozenset(
    {"batch_l2", "sum_grad_squared", "batch_dot", "batch_projection", "grad_batch", "transform"}
)
_FULL_BATCH_KINDS = frozenset({"batch_dot", "batch_projection", "grad_batch", "transform"})


def owning_modules(model: torch.nn.Module) -> dict[int, tuple[str, torch.nn.Module]]:
    """``id(parameter) -> (module name, module)`` of the first module registering it."""
    owners: dict[int, tuple[str, torch.nn.Module]] = {}
    for name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), (name, module))
    return owners


@dataclass
class AttachedModel:
    """The model and per-sample loss that :meth:`Cockpit.attach` registered.

    Attributes:
        model: The module whose forward pass produced the loss.
        loss_fn: ``loss_fn(outputs, targets)`` (or ``loss_fn(outputs)`` without targets) on a
            batch: the per-sample losses ``[B]`` (``reduction="none"``) or their mean.
        names: For each tracked parameter, its name in ``model.named_parameters()``.
        owners: For each tracked parameter, ``(module name, module)`` that registers it.

    """

    model: torch.nn.Module
    loss_fn: Callable[..., Tensor]
    names: list[str]
    owners: list[tuple[str, torch.nn.Module]]

    @classmethod
    def build(
        cls,
        model: torch.nn.Module,
        loss_fn: Callable[..., Tensor],
        params: Sequence[torch.nn.Parameter],
        param_names: Sequence[str],
    ) -> AttachedModel:
        """Check that ``model`` owns every tracked parameter and record names and owners."""
        if not isinstance(model, torch.nn.Module):
            raise MisuseError(
                f"cp.attach(model, loss_fn) needs a torch.nn.Module, got {type(model).__name__}."
            )
        if not callable(loss_fn):
            raise MisuseError(
                "cp.attach(model, loss_fn): loss_fn must be callable as loss_fn(outputs, "
                "targets), e.g. torch.nn.CrossEntropyLoss(reduction='none')."
            )
        names = {id(p): n for n, p in model.named_parameters()}
        owners = owning_modules(model)
        foreign = [n for n, p in zip(param_names, params) if id(p) not in names]
        if foreign:
            raise MisuseError(
                f"cp.attach: the model does not own the tracked parameter(s) {foreign}. Attach "
                "the model whose parameters were given to Cockpit(...)."
            )
        return cls(
            model,
            loss_fn,
            [names[id(p)] for p in params],
            [owners[id(p)] for p in params],
        )


@contextlib.contextmanager
def without_backpack_hooks(model: torch.nn.Module) -> Iterator[None]:
    """Hide BackPACK's module hooks while ``torch.func`` transforms run the model.

    BackPACK's full backward hooks use an ``autograd.Function`` that functorch transforms
    reject, and its forward hooks would store batched tensors on the modules. The hook
    dictionaries are swapped for filtered copies and the originals put back afterwards;
    every other hook stays active.
    """
    try:
        from backpack import hook_run_extensions, hook_store_io
    except ImportError:  # pragma: no cover - BackPACK is a dependency
        yield
        return
    banned = (hook_store_io, hook_run_extensions)
    swapped: list[tuple[torch.nn.Module, str, Any]] = []
    try:
        for module in model.modules():
            for attr in ("_forward_hooks", "_backward_hooks"):
                hooks = getattr(module, attr, None)
                if hooks and any(h in banned for h in hooks.values()):
                    swapped.append((module, attr, hooks))
                    kept = type(hooks)((k, h) for k, h in hooks.items() if h not in banned)
                    setattr(module, attr, kept)
        yield
    finally:
        for module, attr, hooks in reversed(swapped):
            setattr(module, attr, hooks)


def math_attention() -> contextlib.AbstractContextManager:
    """Run ``scaled_dot_product_attention`` in its math kernel (batched by vmap, twice differentiable).

    The fused CPU kernel has no vmap batching rule (a slow per-sample fallback) and no
    double backward.
    """
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


def _split(tree: Any, start: int, end: int) -> Any:
    return tree_map(lambda t: t[start:end] if isinstance(t, Tensor) else t, tree)


def batch_length(inputs: Any) -> int:
    """The batch size of ``inputs`` (a tensor, or a tuple/list/dict of tensors)."""
    leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, Tensor)]
    if not leaves or leaves[0].dim() == 0:
        raise MisuseError(
            "info['inputs'] must be the model's input batch: a tensor with the batch on "
            "dimension 0, or a tuple/list (positional) or dict (keyword) of such tensors."
        )
    return int(leaves[0].shape[0])


class FuncBackend:
    """Computes per-sample statistics of chosen parameters with ``vmap(grad(...))``.

    Args:
        params: The tracked parameters.
        chunk_size: Samples per vectorized pass (``None``: the whole batch at once).

    """

    name = "func"

    def __init__(self, params: Sequence[torch.nn.Parameter], chunk_size: int | None = None):
        self.params = list(params)
        self.chunk_size = chunk_size

    def compute(
        self,
        attached: AttachedModel,
        indices: Sequence[int],
        statistics: Sequence[Statistic],
        inputs: Any,
        targets: Any = None,
    ) -> tuple[dict[tuple[str, str], dict[int, Tensor]], dict[tuple[str, str], str]]:
        """Statistics of the parameters ``indices`` from the batch ``(inputs, targets)``.

        Returns:
            ``(values, failures)``: ``values[identity][i]`` for each parameter index ``i``,
            and a message per statistic whose computation raised (a failure never propagates:
            the statistic is then reported missing).

        """
        stats = [s for s in statistics if s.kind in FUNC_KINDS]
        values: dict[tuple[str, str], dict[int, Tensor]] = {s.identity: {} for s in stats}
        failures: dict[tuple[str, str], str] = {}
        if not stats or not indices:
            return values, failures
        try:
            buffers = self._accumulate(attached, list(indices), stats, inputs, targets)
        except Exception as err:  # a model torch.func cannot run must not break training
            message = _explain(err, attached.model)
            return values, {s.identity: message for s in stats}
        for k, i in enumerate(indices):
            p = self.params[i].detach()
            full = buffers["full"][k] if "full" in buffers else None
            for stat in stats:
                try:
                    value = _finish(stat, k, buffers, full, p)
                except Exception as err:  # a failing transform must not break training
                    failures.setdefault(
                        stat.identity,
                        f"Computing {stat.describe()} raised {type(err).__name__}: {err}",
                    )
                    continue
                values[stat.identity][i] = value.detach()
            if full is not None:
                buffers["full"][k] = None  # free this parameter's per-sample gradients
        return values, failures

    def _accumulate(
        self,
        attached: AttachedModel,
        indices: list[int],
        stats: Sequence[Statistic],
        inputs: Any,
        targets: Any,
    ) -> dict[str, list]:
        """Run the vectorized per-sample gradients chunk by chunk and reduce every chunk."""
        kinds = {s.kind for s in stats}
        batch = batch_length(inputs)
        model = attached.model
        names = [attached.names[i] for i in indices]
        tracked = {n: self.params[i].detach() for n, i in zip(names, indices)}
        const = {n: p.detach() for n, p in model.named_parameters() if n not in tracked}
        const.update(dict(model.named_buffers()))
        loss_fn = attached.loss_fn

        def sample_loss(theta: dict[str, Tensor], x: Any, y: Any) -> Tensor:
            x1 = tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) else t, x)
            args, kwargs = _as_call(x1)
            out = functional_call(model, {**theta, **const}, args, kwargs)
            if y is None:
                return loss_fn(out).sum()
            y1 = tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) else t, y)
            return loss_fn(out, y1).sum()

        in_dims = (None, 0, None if targets is None else 0)
        per_sample = vmap(grad(sample_loss), in_dims=in_dims, randomness="different")
        params = [self.params[i] for i in indices]
        out: dict[str, list] = {}
        if "batch_l2" in kinds:
            out["l2"] = [torch.empty(batch, dtype=p.dtype, device=p.device) for p in params]
        if "sum_grad_squared" in kinds:
            out["sgs"] = [
                torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params
            ]
        if kinds & _FULL_BATCH_KINDS:
            out["full"] = [
                torch.empty(batch, *p.shape, dtype=p.dtype, device=p.device) for p in params
            ]
        step = self.chunk_size or batch
        with without_backpack_hooks(model), math_attention(), torch.enable_grad():
            for start in range(0, batch, step):
                end = min(start + step, batch)
                ys = None if targets is None else _split(targets, start, end)
                grads = per_sample(tracked, _split(inputs, start, end), ys)
                for k, name in enumerate(names):
                    g = grads.pop(name).detach()
                    if "l2" in out:
                        out["l2"][k][start:end] = (g.reshape(end - start, -1) ** 2).sum(1)
                    if "sgs" in out:
                        out["sgs"][k] += (g**2).sum(0)
                    if "full" in out:
                        out["full"][k][start:end] = g
                del grads
        return out


def _as_call(x: Any) -> tuple[tuple, dict]:
    if isinstance(x, dict):
        return (), x
    if isinstance(x, (tuple, list)):
        return tuple(x), {}
    return (x,), {}


def _finish(
    stat: Statistic, k: int, buffers: dict[str, list], full: Tensor | None, p: Tensor
) -> Tensor:
    kind = stat.kind
    if kind == "batch_l2":
        return buffers["l2"][k]
    if kind == "sum_grad_squared":
        return buffers["sgs"][k]
    assert full is not None
    if kind == "batch_dot":
        flat = full.reshape(full.shape[0], -1)
        return flat @ flat.T
    if kind == "grad_batch":
        return full
    if kind == "batch_projection":  # projected on the final gradient by the core
        from cockpit_core.projection import DeferredGrads

        return DeferredGrads(_Materialized(full))
    return stat.fn(full, p)  # type: ignore[misc]


class _Materialized:
    """Per-sample gradients ``[B, *shape]`` in the form ``DeferredGrads`` expects."""

    def __init__(self, grads: Tensor):
        self.grads = grads

    def materialize(self) -> Tensor:
        """The per-sample gradients."""
        return self.grads


def _explain(err: Exception, model: torch.nn.Module) -> str:
    """A message for a failed ``vmap(grad(...))`` pass, with the usual causes."""
    text = f"{type(err).__name__}: {err}".splitlines()[0]
    hint = ""
    low = text.lower()
    batch_norm = any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules()
    )
    if batch_norm:
        hint = (
            " BatchNorm in training mode mixes the samples of a batch, so per-sample "
            "gradients are not defined; use GroupNorm/LayerNorm or track these quantities "
            "in eval mode."
        )
    elif "data-dependent" in low or "item()" in low or ".item" in low:
        hint = (
            " The forward pass uses Python control flow on tensor values, which vmap cannot batch."
        )
    elif "in-place" in low:
        hint = " The forward pass changes a buffer or captured tensor in place."
    return (
        f"torch.func could not compute per-sample gradients ({text}).{hint} Check that "
        "loss_fn(model(inputs), targets) runs on a batch of one sample."
    )
