"""How many tensor operations a quantity issues per tracked step, for cost tests.

On small models a tracked step's excess over plain training is mostly the fixed cost of
dispatching many small tensor operations (3-10 µs each on a CPU), not their arithmetic
(``docs/performance.md``). A quantity that loops over parameters pays it once per
parameter; one that stacks same-shaped tensors or uses ``torch._foreach_*`` pays it once.
:func:`quantity_operations` counts what a quantity's own code issues, so a test can assert
that the count does not grow with the number of parameters::

    few = quantity_operations("my_quantity", hidden_layers=1, package=my_plugin)
    many = quantity_operations("my_quantity", hidden_layers=6, package=my_plugin)
    assert 0 < few == many
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cockpit_core.engine.cockpit import Cockpit

_CORE = str(Path(__file__).resolve().parent.parent)


class OperationCounter(TorchDispatchMode):
    """Counts the ATen operations whose innermost frame of cockpit's code lies in ``package``.

    Frames of the core (``cockpit_core``) in between stop the search: operations the core
    issues for the quantity (``ctx.grads``, the backward pass's statistics) are not counted.

    Args:
        package: The quantity's package (a module, or its directory).

    Attributes:
        count: Operations counted so far.

    """

    def __init__(self, package: ModuleType | str | Path):
        super().__init__()  # type: ignore[no-untyped-call]  # torch's mode is untyped
        if isinstance(package, ModuleType):
            package = Path(str(package.__file__)).parent
        self.package = str(package)
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(self.package):
                self.count += 1
                break
            if filename.startswith(_CORE):
                break
            frame = frame.f_back
        return func(*args, **(kwargs or {}))


def quantity_operations(name: str, hidden_layers: int, *, package: ModuleType | str | Path) -> int:
    """Operations quantity ``name`` issues from ``package`` at the second tracked step.

    The model is a float64 tanh MLP ``3 -> 4 -> ... -> 2`` with ``hidden_layers`` hidden
    ``4 x 4`` layers (``2 * hidden_layers + 4`` parameters), trained with SGD on 8 samples
    and ``name`` tracked at every step (errors raise).

    Raises:
        AssertionError: ``name`` recorded no value.

    """
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(3, 4), torch.nn.Tanh()]
    for _ in range(hidden_layers):
        layers += [torch.nn.Linear(4, 4), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(4, 2)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [name], on_error="raise")
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,))
    counter = OperationCounter(package)
    for step in range(2):
        opt.zero_grad()
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        loss = losses.mean()
        info = {"loss": loss, "individual_losses": losses.detach(), "batch_size": 8}
        info["optimizer"] = opt
        with counter if step == 1 else contextlib.nullcontext():
            with cp(step, info=info):
                loss.backward()
        opt.step()
    recorded = any(name in out for out in cp.get_output().values())
    cp.close()
    assert recorded, f"{name} recorded no value"
    return counter.count
