"""Pieces of the messages the statistics layer gives when a statistic cannot be computed."""

from __future__ import annotations

from collections.abc import Sequence

MODEL_HINT = (
    "call cp.attach(model, loss_fn) (or pass the model: Cockpit(model, ...)) so that cockpit "
    "can route them to a provider that supports the modules (see docs/any_model.md)."
)


def name_list(names: Sequence[str], total: int, shown: int = 5) -> str:
    """``"parameter(s) 'a', 'b'"``, ``"all 16 parameters"`` or the first few and a count."""
    if len(names) == total and total > 1:
        return f"all {total} parameters"
    head = ", ".join(repr(n) for n in names[:shown])
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"parameter(s) {head}{more}"
