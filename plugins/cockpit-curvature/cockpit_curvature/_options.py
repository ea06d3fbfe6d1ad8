"""Option checks of the quantities that pick a curvature estimator (``hess_trace``, TIC).

Both select their estimator with one option (``hess_trace``'s ``method``, the TIC's
``curvature``) and share the options that go with it: ``mc_samples`` for ``diag_ggn_mc``,
``probes`` and ``seed`` for the randomized estimators, which need a fewest number of
products each. A config class takes the two validators of its option::

    _alias = alias_validator("method")
    _options_match_method = options_validator("method", {"hutchinson": 1, "xtrace": 4})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import field_validator, model_validator

from cockpit_curvature._estimators import CALIBRATED_MIN_PRODUCTS, error_bars_calibrated

ALIASES = {"diag_h": "diag_hessian"}
"""Cockpit 1.0.2 spellings accepted for the curvature options."""


def normalize_curvature(value: Any) -> Any:
    """Map Cockpit 1.0.2's ``"diag_h"`` to ``"diag_hessian"``; leave everything else."""
    return ALIASES.get(value, value) if isinstance(value, str) else value


DEFAULT_PROBES = 10
"""Products of Hutchinson and Hutch++ when ``probes`` is not set."""


def default_probes(method: str) -> int:
    """``probes`` when not set: ``CALIBRATED_MIN_PRODUCTS`` for XTrace and XDiag, else 10.

    XTrace and XDiag report error bars only from ``CALIBRATED_MIN_PRODUCTS`` products on,
    so their default gets one; Hutchinson's and Hutch++'s hold at any budget.
    """
    if error_bars_calibrated(method, DEFAULT_PROBES):
        return DEFAULT_PROBES
    return CALIBRATED_MIN_PRODUCTS


def resolve_probes(config: Any, method: str, stochastic: Sequence[str]) -> None:
    """Fill in ``config.probes`` (``None``: not set) with ``method``'s default.

    Only for the estimators in ``stochastic``; the value is not marked as set, so the
    option checks (``model_fields_set``) and re-validation with another method see it
    unset.
    """
    if config.probes is None and method in stochastic:
        config.probes = default_probes(method)
        config.model_fields_set.discard("probes")


def _alias(cls: type, value: Any) -> Any:
    return normalize_curvature(value)


def alias_validator(option: str) -> Any:
    """A field validator (before) that accepts ``"diag_h"`` for ``option``.

    Args:
        option: The field that selects the estimator (``method`` or ``curvature``).

    Returns:
        The validator, to assign to a name in the config class body.

    """
    return field_validator(option, mode="before")(_alias)


def _one_of(names: Sequence[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``."""
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def options_validator(option: str, min_probes: Mapping[str, int]) -> Any:
    """A model validator (after) that checks the options going with ``option``'s value.

    The validator refuses ``mc_samples`` unless ``option`` is ``'diag_ggn_mc'``, and
    ``probes`` or ``seed`` unless it is a randomized estimator (a key of ``min_probes``);
    it fills in the default ``probes`` (:func:`resolve_probes`) and refuses fewer than
    ``min_probes[method]``. Each failure is a ``ValueError`` naming the option.

    Args:
        option: The field that selects the estimator (``method`` or ``curvature``).
        min_probes: ``{estimator: fewest products}`` of the randomized estimators.

    Returns:
        The validator, to assign to a name in the config class body.

    """
    stochastic = tuple(min_probes)

    def check(self: Any) -> Any:
        method = getattr(self, option)
        if "mc_samples" in self.model_fields_set and method != "diag_ggn_mc":
            raise ValueError(f"mc_samples applies only to {option}='diag_ggn_mc'")
        for opt in ("probes", "seed"):
            if opt in self.model_fields_set and method not in min_probes:
                raise ValueError(f"{opt} applies only to {option}={_one_of(stochastic)}")
        resolve_probes(self, method, stochastic)
        least = min_probes.get(method, 1)
        if self.probes is not None and self.probes < least:
            raise ValueError(f"{option}={method!r} needs probes >= {least}, got {self.probes}")
        return self

    return model_validator(mode="after")(check)
