"""Second-order BackPACK extensions that never break ``backward()`` on an unsupported module.

They also run in the parameters' precision when BackPACK saved half-precision layer
inputs and outputs of a float32 model (autocast): see :func:`saved_io_as`.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

import torch

_HALF = (torch.float16, torch.bfloat16)
_IO = re.compile(r"input\d+|output")


class GuardedExtension:
    """Mixin for second-order extensions: a module they cannot handle must not break backward().

    BackPACK raises (``NotImplementedError``, then ``AssertionError`` upstream) inside the
    user's ``loss.backward()`` when a second-order extension meets an unsupported module
    (LayerNorm, GELU, ...). The guard records the first error and skips the rest of the
    pass, so gradients are still computed and the statistic is reported as missing.
    """

    cockpit_failure: str | None = None
    cockpit_statistic: tuple[str, str] = ("", "")
    cockpit_dtype: torch.dtype = torch.float32

    def __call__(
        self,
        module: torch.nn.Module,
        g_inp: tuple[torch.Tensor | None, ...],
        g_out: tuple[torch.Tensor | None, ...],
    ) -> None:
        """Run the extension on ``module`` unless it failed earlier in this pass."""
        if self.cockpit_failure is not None:
            return
        dtype = self.cockpit_dtype
        try:
            with saved_io_as(self, module, dtype):
                g_inp, g_out = _cast(g_inp, dtype), _cast(g_out, dtype)
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


def guarded(
    cls: type, identity: tuple[str, str], params: Sequence[torch.Tensor], **kwargs: object
) -> Any:
    """An instance of the guarded subclass of the BackPACK extension ``cls``.

    Args:
        cls: The BackPACK extension.
        identity: The identity of the statistic it computes.
        params: The tracked parameters: the extension computes in their (promoted) dtype.
        **kwargs: Options of ``cls``.

    """
    if cls not in _GUARDED:
        _GUARDED[cls] = type(
            f"Guarded{cls.__name__}", (GuardedExtension, cls), {"cockpit_base": cls}
        )
    extension = _GUARDED[cls](**kwargs)
    extension.cockpit_statistic = identity
    if params:
        extension.cockpit_dtype = functools.reduce(torch.promote_types, (p.dtype for p in params))
    return extension


@contextlib.contextmanager
def saved_io_as(extension: Any, module: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Show ``extension`` the half-precision inputs and output of ``module`` in ``dtype``.

    Under autocast BackPACK saves a float32 layer's bfloat16/float16 input and output
    (``module.input0``, ``module.output``), and its second-order rules multiply them with
    the float32 weights, which PyTorch refuses ("expected scalar type Float but found
    BFloat16"). With copies in the parameters' ``dtype`` the backpropagated curvature
    factors are float32 from the loss module on, and the inputs carry only their own
    half-precision rounding, as the gradients do. (A half-precision model, ``dtype``
    bfloat16 or float16, needs no copies.) BackPACK passes those factors from layer to
    layer keyed by the ``data_ptr()`` of ``module.output`` and ``module.input{i}``: they
    are moved to the copies' keys before and back to the originals' keys after the rule.
    """
    originals = {
        name: value
        for name, value in vars(module).items()
        if _IO.fullmatch(name) and _is_half(value)
    }
    if not originals or dtype in _HALF:
        yield
        return
    copies = {
        name: value.detach().to(dtype).requires_grad_(value.requires_grad)
        for name, value in originals.items()
    }
    saved = extension.saved_quantities

    def move(source: torch.Tensor, target: torch.Tensor | None) -> None:
        quantity = saved.retrieve_quantity(source.data_ptr(), delete_old=True)
        if quantity is not None and target is not None:
            accumulate = extension.accumulate_backpropagated_quantities
            saved.save_quantity(target.data_ptr(), quantity, accumulate)

    if "output" in copies:
        move(originals["output"], copies["output"])
    for name, copy in copies.items():
        setattr(module, name, copy)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(module, name, original)
        for name, copy in copies.items():  # what the rule left on the output: consumed
            move(copy, None if name == "output" else originals[name])


def _is_half(value: Any) -> TypeGuard[torch.Tensor]:
    return isinstance(value, torch.Tensor) and value.dtype in _HALF


def _cast(
    grads: tuple[torch.Tensor | None, ...], dtype: torch.dtype
) -> tuple[torch.Tensor | None, ...]:
    """Half-precision gradients in ``dtype`` (unless that is half precision as well)."""
    if dtype in _HALF:
        return grads
    return tuple(g.to(dtype) if _is_half(g) else g for g in grads)
