"""The ``info`` keys cockpit observes, and what to pass when it cannot (for messages)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cockpit_core.observe.loss_spec import LOSS_NAMES

OBSERVED_KEYS = frozenset({"batch_size", "individual_losses", "inputs", "targets"})
"""The ``info`` keys cockpit can take from the step's forward pass."""

NO_MODEL = "cockpit does not know the model, so it observes no forward pass"
NO_LOSS = "cockpit knows no loss function"

PASS_YOURSELF: dict[str, str] = {
    "loss": "with cp(step, loss=loss) (with gradient accumulation, run.micro_batch(loss=loss))",
    "batch_size": "info={'batch_size': B}",
    "individual_losses": "info={'individual_losses': losses} (detached, [B], their mean the "
    "loss you backpropagate)",
    "optimizer": "info={'optimizer': opt}",
    "inputs": "info={'inputs': x, 'targets': y}",
    "targets": "info={'inputs': x, 'targets': y}",
}
"""How to pass each ``info`` key at every step (for messages)."""

GIVE_COCKPIT: dict[str, str] = {
    "model": "give cockpit the model, Cockpit(model, ...) or cp.attach(model)",
    "individual_losses": "give cockpit the loss, Cockpit(model, ..., loss_fn=...) or "
    "cp.attach(model, loss_fn): the loss module your loop calls (e.g. nn.CrossEntropyLoss()), "
    f"a name ({LOSS_NAMES}) or a callable loss_fn(outputs, targets) -> per-sample losses [B]",
    "optimizer": "give cockpit the optimizer, Cockpit(..., optimizer=opt) or "
    "cp.attach(model, optimizer=opt)",
}
"""What to give cockpit so that it knows or observes a key itself (for messages)."""


def how_to_pass(key: str, why: str | None) -> str:
    """What to do about a missing ``info`` key that cockpit did not fill because of ``why``.

    ``why`` is ``None`` for keys cockpit does not observe (the loss, the optimizer).
    """
    yourself = PASS_YOURSELF.get(key, f"info={{'{key}': ...}}")
    if key == "loss":
        return f"pass the loss you backpropagate: {yourself}"
    if why == NO_MODEL:
        return f"{GIVE_COCKPIT['model']}, or pass {yourself}"
    if why in (None, NO_LOSS) and key in GIVE_COCKPIT:
        return f"{GIVE_COCKPIT[key]}; or pass {yourself}"
    return f"pass {yourself}"


def observed_keys(requirements: Iterable[Any]) -> frozenset[str]:
    """The keys of :data:`OBSERVED_KEYS` that a step with these ``Requirements`` uses.

    The ``info`` keys they name, and, if they need any statistic, the batch size and the
    batch (for providers that recompute the pass).
    """
    keys: set[str] = set()
    for req in requirements:
        keys |= set(req.info) & OBSERVED_KEYS
        if req.statistics:
            keys |= {"batch_size", "inputs", "targets"}
    return frozenset(keys)
