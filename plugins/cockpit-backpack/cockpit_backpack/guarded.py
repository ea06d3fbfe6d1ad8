"""Second-order BackPACK extensions that never break ``backward()`` on an unsupported module."""

from __future__ import annotations

import torch


class GuardedExtension:
    """Mixin for second-order extensions: a module they cannot handle must not break backward().

    BackPACK raises (``NotImplementedError``, then ``AssertionError`` upstream) inside the
    user's ``loss.backward()`` when a second-order extension meets an unsupported module
    (LayerNorm, GELU, ...). The guard records the first error and skips the rest of the
    pass, so gradients are still computed and the statistic is reported as missing.
    """

    cockpit_failure: str | None = None
    cockpit_statistic: tuple[str, str] = ("", "")

    def __call__(self, module: torch.nn.Module, g_inp: tuple, g_out: tuple) -> None:
        """Run the extension on ``module`` unless it failed earlier in this pass."""
        if self.cockpit_failure is not None:
            return
        try:
            super().__call__(module, g_inp, g_out)  # type: ignore[misc]
        except Exception as err:
            base = type(self).__mro__[2].__name__
            name = type(module).__name__
            self.cockpit_failure = (
                f"BackPACK's {base} does not support module {name}"
                if isinstance(err, NotImplementedError)
                else f"BackPACK's {base} failed on module {name} ({type(err).__name__}: {err})"
            )


_GUARDED: dict[type, type] = {}


def guarded(cls: type, identity: tuple[str, str], **kwargs: object) -> object:
    """An instance of the guarded subclass of the BackPACK extension ``cls``."""
    if cls not in _GUARDED:
        _GUARDED[cls] = type(f"Guarded{cls.__name__}", (GuardedExtension, cls), {})
    extension = _GUARDED[cls](**kwargs)
    extension.cockpit_statistic = identity
    return extension
