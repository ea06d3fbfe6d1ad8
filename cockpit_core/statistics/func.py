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

The recomputed pass must be the user's, or its statistics belong to another network:

* **Randomness.** Dropout draws new masks in every pass, and a per-sample pass cannot
  re-draw the masks of a batched one. The provider records the masks of the user's forward
  pass (a forward pre-hook on the attached model, armed when the provider serves the step)
  and replays sample ``n``'s slice of each in the one-sample pass
  (:mod:`cockpit_core.statistics.replay`): dropout (``nn.Dropout*``, ``F.dropout*``) and
  attention dropout (``scaled_dot_product_attention``, ``nn.MultiheadAttention``) are
  exact. ``vmap`` runs with ``randomness="error"``, so a random call that was not recorded
  cannot draw new numbers. Randomness that cannot be replayed (``torch.rand`` in
  ``forward``, alpha dropout, ``rrelu``, a fused GPU attention kernel's dropout, a pass the
  provider did not observe on a model with dropout) refuses the step: its statistics are
  missing with the reason, training goes on. The user's random stream is unchanged, and so
  is the global generator state across the recomputation.
* **The per-sample mean.** After the pass, ``mean_n g_n`` of every served parameter is
  compared with its ``p.grad`` (one process, whole batch;
  :mod:`cockpit_core.statistics.mean_check`): a parameter whose mean points elsewhere
  loses its statistics at the step, with the reason, instead of delivering them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_map

from cockpit_core.engine.attention import math_attention
from cockpit_core.errors import MissingInfoError, MisuseError
from cockpit_core.statistics import mean_check
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.per_sample import DenseGrads
from cockpit_core.statistics.provider import Collection, ParamSlot, StatisticProvider
from cockpit_core.statistics.replay import (
    Draw,
    ForwardRecord,
    ForwardRecorder,
    ReplayError,
    ReplayMode,
    generators_kept,
)
from cockpit_core.statistics.statistic import Statistic

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
    observes_forward = True  # the random draws of the forward pass, to replay them

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.recorder = ForwardRecorder()
        self._indices: frozenset[int] = frozenset()
        self._backing: dict[StatisticProvider, frozenset[int]] = {}

    @property
    def chunk_size(self) -> int | None:
        """Samples per vectorized pass."""
        return self.options.get("chunk_size")

    # -- observing the forward pass ---------------------------------------------------------

    def attach(self, model: torch.nn.Module, loss_fn: Any = None) -> None:
        """The model whose forward passes are recorded, and the per-sample loss."""
        super().attach(model, loss_fn)
        self.recorder.attach(model)
        self._backing = {}
        self._rearm()

    def arm(self, indices: frozenset[int]) -> None:
        """Record the next forward pass's random draws when it serves ``indices`` (non-empty).

        Also when a provider it served a fallback for is armed, on a model that draws
        random numbers (see :meth:`fell_back`).
        """
        self._indices = frozenset(indices)
        self._rearm()

    def armed(self, indices: frozenset[int]) -> bool:
        """Whether the last forward pass was recorded, or needed not be (no randomness)."""
        return not indices or self.recorder.registered or not self.recorder.stochastic()

    def fell_back(self, others: Mapping[StatisticProvider, frozenset[int]]) -> None:
        """Record the forward passes those providers observe too (they may fall back again)."""
        for provider, indices in others.items():
            if provider.observes_forward:
                self._backing[provider] = self._backing.get(provider, frozenset()) | indices
        self._rearm()

    def suspended(self) -> contextlib.AbstractContextManager[None]:
        """Record no forward pass inside (another provider runs its own pass on the model)."""
        return self.recorder.paused()

    def close(self) -> None:
        """Remove the hooks and drop the records."""
        self._indices, self._backing = frozenset(), {}
        self.recorder.arm(False)

    def _rearm(self) -> None:
        when = None
        backing = dict(self._backing)
        if backing and self.recorder.stochastic():

            def when() -> bool:
                return any(_armed(p, indices) for p, indices in backing.items())

        self.recorder.arm(bool(self._indices) and self.loss_fn is not None, when)

    def supports(self, slot: ParamSlot, kind: StatisticKind) -> str | None:
        """Every per-sample kind, once the model and a per-sample loss are attached."""
        if self.model is None or self.loss_fn is None:
            return "needs the model and a per-sample loss: call cp.attach(model, loss_fn)"
        return None

    @contextlib.contextmanager
    def collect(self, collection: Collection) -> Iterator[None]:
        """Check the batch is in ``info``; compute everything once ``backward`` returned."""
        self._check_ready(collection)
        info = collection.info
        record = self.recorder.take(info["inputs"], batch_length(info["inputs"]))
        yield
        indices = [i for i in sorted(collection.indices) if self.params[i].grad is not None]
        stats = list(collection.statistics)
        if not indices or not stats:
            return
        refusal = self._refusal(record, indices)
        if refusal is not None:
            for stat in stats:
                collection.fail(stat, refusal)
            return
        draws = record.draws if record is not None else []
        try:
            devices = list({self.params[i].device for i in indices})
            with generators_kept([d for d in devices if d.type == "cuda"]):
                buffers = self._accumulate(
                    indices, stats, info["inputs"], info.get("targets"), draws
                )
        except ReplayError as err:
            message = _randomness_message(str(err))
            for stat in stats:
                collection.fail(stat, message)
            return
        except Exception as err:  # a model torch.func cannot run must not break training
            message = _explain(err, self.model)
            for stat in stats:
                collection.fail(stat, message)
            return
        autocast = record.autocast if record is not None else None
        off = self._check_means(collection, indices, buffers.pop("sum"), autocast, record)
        # per parameter, its per-sample gradients (None once delivered: freed)
        fulls: list[Tensor | None] = list(buffers.pop("full", []))
        if off:
            worst = max(off, key=lambda i: off[i][0] / off[i][1])
            names = [self.names[i] for i in off]
            message = mean_check.mismatch_message("torch.func", names, *off[worst])
            for stat in stats:
                if any(i in collection.targets[stat.identity] for i in off):
                    collection.fail(stat, message)
        for k, i in enumerate(indices):
            if i in off:
                continue
            wanted = collection.wanted(i)
            for stat in wanted:
                if stat.kind in _CHUNKED:
                    collection.store(stat, i, buffers[stat.kind][k])
            full = fulls[k] if fulls else None
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
                fulls[k] = None  # free this parameter's per-sample gradients

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

    def _refusal(self, record: ForwardRecord | None, indices: Sequence[int]) -> str | None:
        """Why the recomputed pass cannot be the user's (``None``: it can)."""
        if record is None:
            if not self.recorder.stochastic():
                return None  # nothing to replay; vmap refuses any random call anyway
            if set(indices) <= self._indices:
                why = (
                    "it was not armed: call cp.prepare(step) before the forward pass when "
                    "step numbers are not evenly spaced"
                )
            else:
                why = (
                    "it computes these parameters only because another provider left them "
                    "empty; it observes the forward passes of that provider's steps from "
                    "now on"
                )
            return _randomness_message(
                f"the provider did not observe this step's forward pass ({why}), and the "
                "model has dropout in training mode"
            )
        problem = record.problem()
        return None if problem is None else _randomness_message(problem)

    def _check_means(
        self,
        collection: Collection,
        indices: list[int],
        sums: list[Tensor],
        autocast: torch.dtype | None,
        record: ForwardRecord | None,
    ) -> dict[int, tuple[float, float]]:
        """``{index: (residual, tolerance)}`` of the parameters whose mean misses ``p.grad``.

        Compared when ``p.grad`` is this pass's gradient (one process, whole batch); the
        mean of :attr:`Collection.check_index`, if it passed, goes to the core's loop check.
        ``autocast``: the lower precision of the user's forward pass. Without a ``record``
        of the pass (a deterministic model's pass the provider did not observe) its
        precision is unknown: the loosest tolerance applies.
        """
        if not collection.grad_of_batch:
            return {}
        batch = collection.samples or collection.batch_size
        means = [s / batch for s in sums]
        grads = [g for g in (self.params[i].grad for i in indices) if g is not None]
        values = mean_check.residuals(grads, means)
        off = {}
        for k, value in enumerate(values.tolist()):
            if value <= mean_check.floor(grads[k]):
                continue  # within the strictest tolerance of its dtype (no precision check)
            tol = mean_check.tolerance(grads[k], autocast)
            if record is None:
                tol = max(tol, mean_check.LOOSEST)
            if not value <= tol:
                off[indices[k]] = (value, tol)
        if collection.check_index in indices and collection.check_index not in off:
            collection.check_mean = means[indices.index(collection.check_index)]
        return off

    def _accumulate(
        self,
        indices: list[int],
        stats: Sequence[Statistic],
        inputs: Any,
        targets: Any,
        draws: Sequence[Draw] = (),
    ) -> dict[str, list[Tensor]]:
        """Run the vectorized per-sample gradients chunk by chunk and reduce every chunk.

        ``draws``: the random calls of the user's forward pass, replayed per sample. The
        result also holds ``"sum"``: ``sum_n g_n`` per parameter (for the mean check).
        """
        kinds = {s.kind for s in stats}
        batch = batch_length(inputs)
        model, loss_fn = self.model, self.loss_fn
        if model is None:  # collect() checked it before the step; detached since
            raise MisuseError(
                "The torch.func provider has no model attached: call cp.attach(model, loss_fn)."
            )
        in_model = {id(p): n for n, p in model.named_parameters()}
        names = [in_model[id(self.params[i])] for i in indices]
        tracked = {n: self.params[i].detach() for n, i in zip(names, indices)}
        const = {n: p.detach() for n, p in model.named_parameters() if n not in tracked}
        const.update(dict(model.named_buffers()))

        def sample_loss(theta: dict[str, Tensor], x: Any, y: Any, masks: list[Tensor]) -> Tensor:
            x1 = tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) else t, x)
            args, kwargs = as_call(x1)
            if draws:  # sample n's masks in place of new draws
                replay = ReplayMode(draws, masks)
                with replay:
                    out = functional_call(model, {**theta, **const}, args, kwargs)
                replay.finish()
            else:
                out = functional_call(model, {**theta, **const}, args, kwargs)
            if y is None:
                loss: Tensor = loss_fn(out)  # the user's loss function
            else:
                y1 = tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) else t, y)
                loss = loss_fn(out, y1)
            return loss.sum()

        in_dims = (None, 0, None if targets is None else 0, 0)
        # a random call that was not recorded must not draw new numbers: it raises instead
        per_sample = vmap(grad(sample_loss), in_dims=in_dims, randomness="error")
        params = [self.params[i] for i in indices]
        out: dict[str, list[Tensor]] = {
            "sum": [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]
        }
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
        with math_attention(), torch.enable_grad(), self.recorder.paused():
            for start in range(0, batch, step):
                end = min(start + step, batch)
                ys = None if targets is None else _split(targets, start, end)
                masks = [d.mask[start:end] for d in draws]
                grads = per_sample(tracked, _split(inputs, start, end), ys, masks)
                for k, name in enumerate(names):
                    g = grads.pop(name).detach()
                    out["sum"][k] += g.sum(0)
                    if "batch_l2" in out:
                        out["batch_l2"][k][start:end] = (g.reshape(end - start, -1) ** 2).sum(1)
                    if "sum_grad_squared" in out:
                        out["sum_grad_squared"][k] += (g**2).sum(0)
                    if "full" in out:
                        out["full"][k][start:end] = g
                del grads
        return out


def as_call(x: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` to call a model with its inputs ``x`` (a tensor, tuple/list or dict)."""
    if isinstance(x, dict):
        return (), x
    if isinstance(x, (tuple, list)):
        return tuple(x), {}
    return (x,), {}


def _armed(provider: StatisticProvider, indices: frozenset[int]) -> bool:
    """Whether ``provider`` is armed for ``indices`` now (a provider that raises is not)."""
    try:
        return bool(provider.armed(indices))
    except Exception:  # plugin code must not break the user's forward pass
        return False


def _randomness_message(detail: str) -> str:
    """Why the statistics torch.func would recompute at this step are missing."""
    return (
        "torch.func recomputes per-sample gradients after backward and must use the random "
        f"numbers of your forward pass (dropout masks), but {detail}. Per-sample "
        "gradients with other random numbers would belong to another network, so these "
        "statistics are missing at this step (training is unaffected). Dropout modules, "
        "F.dropout* and attention dropout are replayed exactly; for other random "
        "operations make the forward pass of tracked steps deterministic, or let module "
        "hooks serve these parameters (docs/any_model.md)."
    )


def _explain(err: Exception, model: torch.nn.Module | None) -> str:
    """A message for a failed ``vmap(grad(...))`` pass, with the usual causes."""
    text = f"{type(err).__name__}: {err}".splitlines()[0]
    hint = ""
    low = text.lower()
    batch_norm = model is not None and any(
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
    elif "randomness error mode" in low or "random operation" in low:
        return _randomness_message(
            "the recomputed forward pass calls a random operation that your forward pass "
            f"did not record ({text})"
        )
    elif "in-place" in low:
        hint = " The forward pass changes a buffer or captured tensor in place."
    return (
        f"torch.func could not compute per-sample gradients ({text}).{hint} Check that "
        "loss_fn(model(inputs), targets) runs on a batch of one sample."
    )
