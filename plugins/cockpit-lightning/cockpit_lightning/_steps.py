"""How the Lightning callback maps backward passes onto Cockpit steps.

With ``accumulate_grad_batches=K`` the callback opens ``with cp(step, ...,
accumulate=True)`` at the first backward pass of an optimizer step and each backward pass
in ``run.micro_batch``; an :class:`AccumulatedStep` keeps both and the micro-batch sizes,
which say whether the accumulated gradient is the mean over the step's samples (``K``
equal micro-batches). Without accumulation a Cockpit takes one backward pass per step;
:func:`second_backward_message` says what to do when a second one comes.
"""

from __future__ import annotations

from typing import Any


class AccumulatedStep:
    """An accumulated step: its ``with cp(..., accumulate=True)`` run and micro-batches.

    Args:
        run: The entered step run (``cp(step, info=..., accumulate=True)``).

    Attributes:
        micro: The entered micro-batch of the running backward pass (``None`` between).
        sizes: The size of each micro-batch so far (``None`` where unknown).

    """

    def __init__(self, run: Any):
        self.run = run
        self.micro: Any = None
        self.sizes: list[int | None] = []

    def uneven(self, accumulate: int) -> str | None:
        """Why the step's statistics are not exact, or ``None`` for ``K`` equal micro-batches.

        Args:
            accumulate: Lightning's ``accumulate_grad_batches`` (``K``).

        """
        if len(self.sizes) == accumulate and len(set(self.sizes)) == 1:
            return None
        return (
            f"cockpit: an accumulated step had micro-batches of sizes {self.sizes} instead "
            f"of {accumulate} of size {self.sizes[0]}. Lightning divides each "
            f"micro-batch's loss by accumulate_grad_batches={accumulate}, so the "
            "accumulated gradient is not the mean over the samples and that step's "
            "per-sample statistics are not exact. Use a number of batches per epoch divisible "
            "by accumulate_grad_batches and equal batches (drop_last=True)."
        )


def second_backward_message(index: int | None, step: int, batch: int) -> str:
    """Why a Cockpit cannot take a second backward pass at ``step``, and what to do.

    Args:
        index: The optimizer of the Cockpit (``None``: its parameters span several).
        step: The Cockpit's step.
        batch: The training batch (from 0).

    """
    which = "the Cockpit" if index is None else f"the Cockpit of optimizer {index}"
    if index is None:
        fix = (
            "Its parameters belong to several optimizers, each with its own backward "
            "pass: give each optimizer its own Cockpit, CockpitCallback({0: Cockpit("
            "params_of_opt_0, ...), 1: Cockpit(params_of_opt_1, ...)})."
        )
    else:
        fix = (
            "Call the optimizer's step() after each manual_backward() it tracks (gradient "
            "accumulation in manual optimization is not supported), or set "
            "self.cockpit_info['optimizer_index'] to the optimizer each backward pass "
            "belongs to."
        )
    return (
        f"CockpitCallback: {which} would see a second backward pass at its step {step} "
        f"(training batch {batch}) before its optimizer stepped; a Cockpit "
        f"tracks one backward pass per step. {fix}"
    )
