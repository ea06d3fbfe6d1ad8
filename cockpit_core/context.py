"""What a quantity sees while it computes: :class:`StepContext`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from cockpit_core.cache import Cache, QuantityCache
from cockpit_core.engine.micro_batch_norms import MicroBatchNorms
from cockpit_core.errors import MisuseError, UnsupportedModelError
from cockpit_core.statistics.statistic import Statistic
from cockpit_core.step_data import StepData

T = TypeVar("T")


class StepContext:
    """The view of one step that a quantity's ``compute`` receives.

    Attributes:
        step: The step being tracked.
        info: The ``info`` dict the user passed (``loss``, ``batch_size``, ...).
        params: The tracked parameters, in order.
        param_names: Their names (``"0"``, ``"1"``, ... if the Cockpit got bare parameters).
        cache: This quantity's private cross-step cache.

    """

    def __init__(
        self, data: StepData, owner: str, allowed: frozenset[tuple[str, str]], cache: Cache
    ):
        self._data = data
        self._owner = owner
        self._allowed = allowed
        self.step = data.step
        self.info = data.info
        self.params = data.params
        self.param_names = data.param_names
        self.cache = QuantityCache(cache, owner)

    @property
    def grads(self) -> list[Tensor]:
        """The mini-batch gradient of each parameter (``p.grad``, detached, unscaled).

        Unscaled: divided by the scale of ``info["grad_scaler"]`` while ``p.grad`` is
        scaled; half-precision gradients are given in float32.
        """
        return self._data.grads

    @property
    def batch_size(self) -> int:
        """``info["batch_size"]``, or the length of ``info["individual_losses"]``."""
        if "batch_size" in self.info:
            return int(self.info["batch_size"])
        if "individual_losses" in self.info:
            return len(self.info["individual_losses"])
        raise MisuseError(
            f"'{self._owner}' needs the batch size: pass info={{'batch_size': B, ...}}."
        )

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """``info["optimizer"]`` if given."""
        return self.info.get("optimizer")

    def stat(self, statistic: Statistic) -> list[Tensor]:
        """One tensor per parameter of a statistic declared in ``requirements()``.

        Raises:
            KeyError: The quantity did not declare this statistic.
            UnsupportedModelError: It could not be computed for some parameters.

        """
        ident = statistic.identity
        if ident not in self._allowed:
            raise KeyError(
                f"'{self._owner}' reads statistic {statistic.describe()} that its requirements() "
                "do not declare; add it to Requirements(statistics=...)."
            )
        if ident in self._data.missing:
            raise UnsupportedModelError(self._data.missing[ident])
        return self._data.statistics[ident]  # type: ignore[return-value]

    def shared(self, key: str, compute: Callable[[], T]) -> T:
        """A value computed once per step for every quantity that asks with the same ``key``.

        For a reduction that several quantities of a plugin need (e.g. the gradient tests'
        projections and norms): the first caller's ``compute()`` runs, the others get its
        result, and it is dropped when the step ends. Name the key after the plugin
        (``"cockpit_gradient_tests.gram"``), and share only values computed from what every
        caller declared in its requirements. If ``compute`` raises, nothing is kept and
        the next caller computes again (and gets its own error).
        """
        return self._data.shared(key, compute)

    def probe(self, key: str) -> dict[str, list[Any]]:
        """What the probe ``key`` recorded in this step's forward passes.

        Returns:
            ``{module name: [reduce(...) of each call]}`` (``""`` names the model itself), in
            the order the modules first ran; the values are still on the device.

        Raises:
            KeyError: No probe ``key`` was armed for this step (declare it in
                ``Requirements(probes=...)``).
            UnsupportedModelError: It recorded nothing, with the reason (no model known, no
                selected module ran with gradients enabled, its ``reduce`` raised).

        """
        probes = self._data.probes
        if key in probes.errors:
            raise UnsupportedModelError(f"probe '{key}': {probes.errors[key]}")
        if key not in probes.values:
            raise KeyError(
                f"'{self._owner}' reads probe '{key}', which was not armed for step "
                f"{self.step}; declare it in Requirements(probes=...)."
            )
        return probes.values[key]

    @property
    def micro_batch_norms(self) -> MicroBatchNorms:
        """The squared norm of each micro-batch's own gradient (all processes), per parameter.

        Requires ``Requirements(micro_batch_norms=True)``. A step without accumulation is one
        micro-batch per process. See :class:`~cockpit_core.engine.micro_batch_norms.MicroBatchNorms`.

        Raises:
            KeyError: No quantity of this step declared ``micro_batch_norms=True``.
            UnsupportedModelError: They could not be recorded, with the reason.

        """
        norms = self._data.micro_batch_norms
        if norms is None:
            raise KeyError(
                f"'{self._owner}' reads ctx.micro_batch_norms, which were not recorded at step "
                f"{self.step}; declare Requirements(micro_batch_norms=True)."
            )
        if isinstance(norms, str):
            raise UnsupportedModelError(norms)
        return norms

    def hvp(self, vectors: Sequence[Tensor]) -> list[Tensor]:
        """Hessian-vector product of the mini-batch loss, one tensor per parameter.

        Requires ``Requirements(loss_graph=True)`` and ``info["loss"]``.
        """
        if self._data.hvp is None:
            raise KeyError(
                f"'{self._owner}' calls ctx.hvp but its requirements() do not set loss_graph=True."
            )
        return self._data.hvp(vectors)

    @property
    def hvp_count(self) -> int:
        """Number of Hessian-vector products computed so far at this step (all quantities)."""
        return 0 if self._data.hvp is None else self._data.hvp.count
