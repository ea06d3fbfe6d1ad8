"""Each micro-batch's own gradient, as squared norms recorded during its backward pass.

Some estimators need the gradients of the step's micro-batches separately, not only the
accumulated ``p.grad``: the gradient noise scale from two batch sizes (McCandlish et al.,
2018, "An Empirical Model of Large-Batch Training", Appendix A) compares the micro-batch
gradients with the accumulated one. A quantity asks for them with
``Requirements(micro_batch_norms=True)`` and reads ``ctx.micro_batch_norms``
(:class:`MicroBatchNorms`).

A *micro-batch* is one ``run.micro_batch(...)`` of a step opened with ``accumulate=True``,
or the whole ``with cp(step, ...)`` block of a step without accumulation. While its
backward pass runs, a tensor hook on every tracked parameter receives the gradient that
pass contributes, before autograd adds it to ``p.grad``, and reduces it on the device to
its norm. Nothing is copied (a difference of ``p.grad`` before and after the pass would
keep a second gradient), nothing waits for the host: the ``P`` norms of a pass are stacked
on the device and leave it once, when a quantity reads them. Under ``torch.distributed``
the hook sees the process's local gradient, before DDP's all-reduce overwrites ``p.grad``;
the core then gathers every process's micro-batches
(:mod:`cockpit_core.distributed.micro_batch_norms`). The hooks exist only during the
passes: a provider that recomputes the pass afterwards, or ``torch.autograd.grad`` of
Hessian-vector products, is not counted.

Precision: each norm is reduced in float32 (float64 for float64 gradients, so that
reference tests are exact) and squared in float64. PyTorch reduces in blocks, so the
relative error of a norm is a few ``1e-7`` even over billions of entries. An estimator
that subtracts two such sums, e.g. ``sum_m b_m |g_m|^2 - B |g|^2``, loses a factor
``B |G|^2 / ((M - 1) tr(Sigma))`` of that precision: it matters only where the gradient
noise is a million times smaller than the signal, far beyond the estimator's statistical
error.

A parameter whose hook fires twice in one pass (``backward()`` called twice inside one
micro-batch, or reentrant gradient checkpointing with the parameter inside and outside a
checkpointed segment) has two parts whose norms do not give the norm of their sum: the
step then holds the reason instead of a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cockpit_core.errors import MisuseError


@dataclass(frozen=True)
class MicroBatchNorms:
    """The step's micro-batches and the squared norms of their own gradients.

    With the losses scaled as cockpit asks (each micro-batch backpropagates its mean loss
    times its share ``b_m / B`` of the step's ``B`` samples, ``docs/distributed.md``), the
    pass of micro-batch ``m`` adds ``c_m = (b_m / B) g_m`` to ``p.grad``, where ``g_m`` is
    the gradient of the micro-batch's own mean loss. Rows are in rank order, then in the
    order the micro-batches ran.

    Attributes:
        contributions: ``[M, P]`` float64, ``|c_m,i|^2`` for micro-batch ``m`` and tracked
            parameter ``i`` (unscaled by a ``GradScaler``; 0 where a parameter received no
            gradient). On the gradients' device on one process, on the collectives' device
            under ``torch.distributed``.
        samples: ``b_m`` of each micro-batch (0: unknown).
        shares: ``b_m / B`` with ``B`` the step's batch size on the micro-batch's process
            (1 for a step without accumulation; NaN: unknown).
        ranks: The process that ran each micro-batch (all 0 on one process).

    """

    contributions: Tensor
    samples: tuple[int, ...]
    shares: tuple[float, ...]
    ranks: tuple[int, ...]

    def __len__(self) -> int:
        """``M``, the number of micro-batches (of all processes)."""
        return len(self.samples)

    def grad_sq(self) -> Tensor:
        """``[M, P]`` float64: ``|g_m,i|^2 = |c_m,i|^2 / share_m^2``, each micro-batch's own gradient.

        Raises:
            MisuseError: A micro-batch's share of the step is unknown (its batch size was
                neither passed nor observed).

        """
        if any(not (math.isfinite(s) and s > 0) for s in self.shares):
            raise MisuseError(
                "the size of some micro-batch is unknown, so its own gradient cannot be told "
                "from its contribution: pass run.micro_batch({'batch_size': b, ...}) (or "
                "individual_losses) and the step's total, cp(step, info={'batch_size': B}, "
                "accumulate=True)."
            )
        shares = torch.tensor(
            self.shares, dtype=torch.float64, device=self.contributions.device
        ).reshape(-1, 1)
        return self.contributions / shares**2


class NormRecorder:
    """Records :class:`MicroBatchNorms` of one step: :meth:`begin` and :meth:`end` around each pass.

    Never raises into the backward pass: a failure is kept and becomes the step's reason.

    Args:
        params: The tracked parameters.
        names: Their names (for messages).
        loss_scale: The factor the backpropagated losses carry (a ``GradScaler``'s scale).

    """

    def __init__(self, params: Sequence[Tensor], names: Sequence[str], loss_scale: float = 1.0):
        self.params = list(params)
        self.names = list(names)
        self.loss_scale = float(loss_scale)
        self.rows: list[Tensor] = []
        self.samples: list[int] = []
        self.shares: list[float] = []
        self.failure: str | None = None
        self.repeated: set[int] = set()
        self.norms: list[Tensor | None] = []
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.recording = False  # between begin and end

    def begin(self) -> None:
        """Hook the parameters for one micro-batch's backward pass."""
        self.close()
        self.recording = True
        if self.failure is not None:  # an earlier pass failed: the step has no value anyway
            return
        self.norms = [None] * len(self.params)
        try:
            for i, p in enumerate(self.params):
                if p.requires_grad:
                    self.handles.append(p.register_hook(self._hook(i)))
        except Exception as err:  # e.g. a parameter that is not a leaf of any graph
            self.close()
            self.failure = self.failure or f"hooking the parameters raised {_describe(err)}"

    def _hook(self, i: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            try:
                g = grad.detach()
                if g.is_sparse:
                    g = g.coalesce().values()
                dtype = torch.float64 if g.dtype == torch.float64 else torch.float32
                norm = torch.linalg.vector_norm(g, dtype=dtype)
                if self.norms[i] is None:
                    self.norms[i] = norm
                else:
                    self.repeated.add(i)
            except Exception as err:
                self.failure = self.failure or (
                    f"the norm of {self.names[i]!r}'s gradient raised {_describe(err)}"
                )

        return hook

    def end(self, samples: int, share: float | None) -> None:
        """The pass ended: remove the hooks and keep its row (``share``: ``b / B``, ``None``: unknown)."""
        if not self.recording:
            return
        self.recording = False
        self.close()
        if self.failure is not None:
            return
        try:
            device = self.params[0].device if self.params else torch.device("cpu")
            parts = [
                torch.zeros((), dtype=torch.float64, device=device)
                if n is None
                else n.to(device, torch.float64)
                for n in self.norms
            ]
            row = torch.stack(parts) ** 2 if parts else torch.zeros(0, dtype=torch.float64)
            if self.loss_scale != 1.0:
                row = row / self.loss_scale**2
        except Exception as err:
            self.failure = f"stacking the norms raised {_describe(err)}"
            return
        finally:
            self.norms = []
        self.rows.append(row)
        self.samples.append(int(samples or 0))
        self.shares.append(math.nan if share is None else float(share))

    def close(self) -> None:
        """Remove the hooks (a pass that raised, or the step's end)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def result(self) -> MicroBatchNorms | str:
        """What the step recorded, or why it has nothing to show."""
        self.close()
        if self.failure is not None:
            return f"the micro-batch gradient norms could not be recorded: {self.failure}"
        if self.repeated:
            listed = ", ".join(repr(self.names[i]) for i in sorted(self.repeated)[:5])
            more = len(self.repeated) - 5
            listed += f" and {more} more" if more > 0 else ""
            return (
                f"the gradient of {listed} arrived in several parts during one micro-batch's "
                "backward pass (backward() called more than once inside one micro-batch, or "
                "reentrant gradient checkpointing with the parameter inside and outside a "
                "checkpointed segment), and the norms of the parts do not give the norm of "
                "their sum: wrap each backward() in its own run.micro_batch(...), or use "
                "torch.utils.checkpoint with use_reentrant=False"
            )
        if not self.rows:
            return (
                "no micro-batch's backward pass was seen: with accumulate=True, run each "
                "micro-batch's backward() inside `with run.micro_batch(...)`"
            )
        return MicroBatchNorms(
            torch.stack(self.rows),
            tuple(self.samples),
            tuple(self.shares),
            (0,) * len(self.rows),
        )


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"
