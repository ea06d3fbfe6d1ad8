"""Options of the ``autodiff`` provider: the HVP bound, the block size and the MC seed.

A provider receives ``options`` from its Cockpit (``StatisticProvider(params, names,
options)``; ``docs/providers.md``). The ``autodiff`` provider reads the keys of
:class:`AutodiffOptions` there, falls back to its class's defaults, and validates both.
Until the Cockpit itself forwards these keys, a Cockpit gets its own settings through a
registry whose ``autodiff`` entry is a configured subclass
(:func:`~cockpit_autodiff.registry.autodiff_registry`), never by changing
:class:`~cockpit_autodiff.AutodiffProvider` for the whole process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cockpit_core.errors import ConfigError

DEFAULT_MAX_HVPS = 50_000
"""Largest number of tracked parameter entries whose exact Hessian diagonal is computed."""

DEFAULT_BLOCK = 256
"""Unit vectors per batched double-backward call (memory: ``block`` x the backward pass)."""


class AutodiffOptions(BaseModel):
    """Options of the ``autodiff`` provider (each also a class attribute of the provider)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_hvps: int = Field(
        DEFAULT_MAX_HVPS,
        ge=0,
        strict=True,
        description="Largest number of tracked parameter entries (= Hessian-vector products "
        "per tracked step) for which the exact Hessian diagonal is computed; above it the "
        "provider declines diag_hessian and names the estimators to use instead.",
    )
    block: int = Field(
        DEFAULT_BLOCK,
        ge=1,
        strict=True,
        description="Unit vectors per batched double-backward call of the exact Hessian "
        "diagonal (memory grows linearly with it).",
    )
    mc_seed: int = Field(
        0,
        ge=0,
        strict=True,
        description="Seed of the provider's own random generator for diag_ggn_mc (the "
        "global torch RNG is never used, so tracking does not change the training's "
        "randomness); process r of torch.distributed uses mc_seed + 1000003 r.",
    )


OPTION_NAMES = tuple(AutodiffOptions.model_fields)


def resolve_options(
    defaults: Mapping[str, Any], options: Mapping[str, Any], only_known: bool = True
) -> AutodiffOptions:
    """The provider's options: ``defaults`` overridden by the non-``None`` ``options``.

    Args:
        defaults: The provider class's defaults (its attributes ``max_hvps``, ...).
        options: The Cockpit's provider options, or those given to ``configured``.
        only_known: Ignore keys that are not options of this provider (the Cockpit's
            options are shared by every provider); ``False``: reject them.

    Raises:
        ConfigError: An invalid value (or unknown key); the path names ``autodiff.<option>``.

    """
    base = dict(defaults)
    keys = OPTION_NAMES if only_known else tuple(options)
    base.update({k: options[k] for k in keys if options.get(k) is not None})
    try:
        return AutodiffOptions(**base)
    except ValidationError as err:
        raise ConfigError(
            [
                (".".join(["autodiff", *map(str, e["loc"])]), e["msg"])
                for e in err.errors(include_url=False)
            ]
        ) from None
