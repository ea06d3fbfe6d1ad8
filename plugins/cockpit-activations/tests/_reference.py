"""Independent references: module outputs captured by the test's own hooks, reduced in float64."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch


def output_tensor(output):
    """The test's own reading of a module output: the tensor, ``.logits`` or item 0."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "to_tuple"):
        return output.to_tuple()[0]
    return output[0]


def capture(
    model: torch.nn.Module, names: Iterable[str], forward: Callable[[], object]
) -> dict[str, np.ndarray]:
    """Run ``forward`` under no_grad; the outputs of the named modules, flattened, float64.

    Several calls of one module are concatenated (in call order).
    """
    modules = dict(model.named_modules())
    got: dict[str, list[np.ndarray]] = {}
    handles = []
    for name in names:

        def hook(module, inputs, output, name=name):
            x = output_tensor(output).detach().to("cpu", torch.float64).numpy().ravel()
            got.setdefault(name, []).append(x)

        handles.append(modules[name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()
    return {name: np.concatenate(parts) for name, parts in got.items()}


def stats(x: np.ndarray) -> dict[str, float]:
    """RMS, max |x| and zero fraction by their definitions."""
    return {
        "rms": float(np.sqrt(np.mean(x**2))),
        "amax": float(np.max(np.abs(x))),
        "zero_frac": float(np.mean(x == 0)),
    }


def assert_matches(value: dict, reference: dict[str, np.ndarray], rtol: float = 1e-10) -> None:
    """``activations``' output equals the reference statistics of every module."""
    assert sorted(value["modules"]) == sorted(reference)
    for i, name in enumerate(value["modules"]):
        ref = stats(reference[name])
        for key in ("rms", "amax", "zero_frac"):
            np.testing.assert_allclose(
                value[key][i], ref[key], rtol=rtol, atol=0, err_msg=f"{key} of {name}"
            )
