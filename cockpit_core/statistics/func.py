"""Per-sample statistics of any model with ``torch.func`` (no BackPACK support needed).

The per-sample gradient ``g_n = grad_theta l_n(theta)`` of sample ``n``'s own loss is
computed by vectorizing a one-sample gradient over the batch,
``vmap(grad(l), in_dims=(None, 0, 0))`` with ``l(theta, x_n, y_n)`` evaluated by
``functional_call`` on a batch of one (Horace He and Richard Zou, 2021, "functorch: JAX-like
composable function transforms for PyTorch"; the per-sample-gradient recipe of the PyTorch
documentation). The provider ``func`` runs after the user's ``backward`` on the attached
model, inputs and per-sample loss, chunk by chunk over the batch, and reduces each chunk
to the statistics per parameter at once (Dangel et al., 2020, BackPACK, define the same
statistics):

    batch_l2:          ||g_n||^2                   (per sample, [B])
    sum_grad_squared:  sum_n g_n * g_n             (parameter shape)
    batch_dot:         g_n . g_m                   ([B, B])
    batch_projection:  g_n . g                     ([B], g: the final mini-batch gradient)
    grad_batch:        g_n                         ([B, *shape])
    transform:         fn([g_1, ..., g_B], theta)

Memory: ``batch_l2`` and ``sum_grad_squared`` keep one chunk of per-sample gradients
(``chunk_size x D``); the other kinds need every sample of a parameter at once and keep
``B x D_p`` values of one parameter at a time.

It serves every parameter no cheaper provider supports (``backend="auto"``), and those a
cheaper provider left without a statistic at a step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_map

from cockpit_core.attention import math_attention
from cockpit_core.errors import MissingInfoError, MisuseError
from cockpit_core.requirements import Statistic
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.per_sample import DenseGrads
from cockpit_core.statistics.provider import Collection, ParamSlot, StatisticProvider

_CHUNKED = frozenset({"batch_l2", "sum_grad_squared"})
"""Kinds reduced chunk by chunk (the others need every sample of a parameter at once)."""


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


class FuncProvider(StatisticProvider):
    """Per-sample statistics of any model with ``vmap(grad(...))``, after ``backward``.

    Needs ``cp.attach(model, loss_fn)`` and the batch in ``info["inputs"]`` (and
    ``info["targets"]``). Option ``chunk_size``: samples per vectorized pass (``None``: the
    whole batch at once).
    """

    name = "func"
    cost = 10.0
    description = "torch.func: per-sample gradients of any model, recomputed after backward"
    recomputes = True
    per_sample = True

    @property
    def chunk_size(self) -> int | None:
        """Samples per vectorized pass."""
        return self.options.get("chunk_size")

    def supports(self, slot: ParamSlot, kind: StatisticKind) -> str | None:
        """Every per-sample kind, once the model and a per-sample loss are attached."""
        if self.model is None or self.loss_fn is None:
            return "needs the model and a per-sample loss: call cp.attach(model, loss_fn)"
        return None

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Check the batch is in ``info``; compute everything once ``backward`` returned."""
        self._check_ready(collection)
        yield
        indices = [i for i in sorted(collection.indices) if self.params[i].grad is not None]
        stats = list(collection.statistics)
        if not indices or not stats:
            return
        info = collection.info
        try:
            buffers = self._accumulate(indices, stats, info["inputs"], info.get("targets"))
        except Exception as err:  # a model torch.func cannot run must not break training
            message = _explain(err, self.model)
            for stat in stats:
                collection.fail(stat, message)
            return
        for k, i in enumerate(indices):
            wanted = collection.wanted(i)
            for stat in wanted:
                if stat.kind in _CHUNKED:
                    collection.store(stat, i, buffers[stat.kind][k])
            full = buffers["full"][k] if "full" in buffers else None
            if full is not None:
                rest = [s for s in wanted if s.kind not in _CHUNKED]
                sub = Collection(
                    tuple(rest), {s.identity: frozenset({i}) for s in rest}, collection.slots, 0
                )
                sub.deliver(i, DenseGrads(full), defer=True)  # projected on p.grad by the core
                for stat in rest:
                    if sub.received(stat, i):
                        collection.store(stat, i, sub.results[stat.identity][i])
                    elif stat.identity in sub.missing:
                        collection.fail(stat, sub.missing[stat.identity])
                buffers["full"][k] = None  # free this parameter's per-sample gradients

    def _check_ready(self, collection: Collection) -> None:
        if self.model is None or self.loss_fn is None:
            raise MisuseError(
                "The torch.func provider computes per-sample statistics from the model and a "
                "per-sample loss: call cp.attach(model, loss_fn) before training, e.g. "
                "cp.attach(model, torch.nn.CrossEntropyLoss(reduction='none'))."
            )
        info = collection.info
        if "inputs" not in info:
            owners = ", ".join(sorted({collection.slots[i].label for i in collection.indices}))
            raise MissingInfoError(
                "Per-sample statistics of the attached model are computed with torch.func "
                f"(for {owners}), which needs the batch: pass info={{'inputs': x, 'targets': "
                "y, ...}} to cp(step, info=...)."
            )
        n = batch_length(info["inputs"])
        expected = collection.samples or collection.batch_size  # a micro-batch: its own size
        if n != expected:
            what = "this micro-batch has" if collection.samples else "the batch size is"
            raise MisuseError(
                f"info['inputs'] holds {n} samples but {what} {expected}: pass the inputs of "
                "the (micro-)batch whose loss is backpropagated."
            )

    def _accumulate(
        self,
        indices: list[int],
        stats: Sequence[Statistic],
        inputs: Any,
        targets: Any,
    ) -> dict[str, list]:
        """Run the vectorized per-sample gradients chunk by chunk and reduce every chunk."""
        kinds = {s.kind for s in stats}
        batch = batch_length(inputs)
        model, loss_fn = self.model, self.loss_fn
        in_model = {id(p): n for n, p in model.named_parameters()}
        names = [in_model[id(self.params[i])] for i in indices]
        tracked = {n: self.params[i].detach() for n, i in zip(names, indices)}
        const = {n: p.detach() for n, p in model.named_parameters() if n not in tracked}
        const.update(dict(model.named_buffers()))

        def sample_loss(theta: dict[str, Tensor], x: Any, y: Any) -> Tensor:
            x1 = tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) else t, x)
            args, kwargs = as_call(x1)
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
            out["batch_l2"] = [torch.empty(batch, dtype=p.dtype, device=p.device) for p in params]
        if "sum_grad_squared" in kinds:
            out["sum_grad_squared"] = [
                torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params
            ]
        if kinds - _CHUNKED:
            out["full"] = [
                torch.empty(batch, *p.shape, dtype=p.dtype, device=p.device) for p in params
            ]
        step = self.chunk_size or batch
        with math_attention(), torch.enable_grad():
            for start in range(0, batch, step):
                end = min(start + step, batch)
                ys = None if targets is None else _split(targets, start, end)
                grads = per_sample(tracked, _split(inputs, start, end), ys)
                for k, name in enumerate(names):
                    g = grads.pop(name).detach()
                    if "batch_l2" in out:
                        out["batch_l2"][k][start:end] = (g.reshape(end - start, -1) ** 2).sum(1)
                    if "sum_grad_squared" in out:
                        out["sum_grad_squared"][k] += (g**2).sum(0)
                    if "full" in out:
                        out["full"][k][start:end] = g
                del grads
        return out


def as_call(x: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` to call a model with its inputs ``x`` (a tensor, tuple/list or dict)."""
    if isinstance(x, dict):
        return (), x
    if isinstance(x, (tuple, list)):
        return tuple(x), {}
    return (x,), {}


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
