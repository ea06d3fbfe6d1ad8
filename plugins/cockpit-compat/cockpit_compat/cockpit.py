"""Cockpit 1.0.2's ``Cockpit`` class on top of the native :class:`cockpit_core.Cockpit`.

Every call is forwarded to a native Cockpit (:attr:`Cockpit.native`); this class only
translates the quantities (:mod:`cockpit_compat.quantities`) and the output layout.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cockpit_compat.quantities.quantity import DROP, Quantity, is_native_quantity
from cockpit_core.engine.cockpit import Cockpit as NativeCockpit
from cockpit_core.engine.metrics import METRICS_KEY, REFERENCE_METRICS
from cockpit_core.log import write_json_atomic
from cockpit_core.plugin.registry import Registry, default_registry

LOG_NAMES = REFERENCE_METRICS
"""The arguments of Cockpit 1.0.2's ``log`` after ``global_step``, in order."""


@dataclass
class _Entry:
    """A tracked quantity: its compat object (``None`` for a native one) and both keys."""

    quantity: Any
    native_key: str
    legacy_key: str

    def convert(self, value: Any, step: int) -> Any:
        if isinstance(self.quantity, Quantity):
            return self.quantity.to_legacy(value, step)
        return value


class Cockpit:
    """Cockpit 1.0.2's ``Cockpit(params, quantities)``, computed by a native Cockpit.

    Args:
        params: The parameters to track (``model.parameters()``); every one must require
            gradients.
        quantities: Instances of :mod:`cockpit_compat.quantities` (e.g. from
            ``configuration("full")``); native quantity instances work too and keep their
            native key and value. ``None``: nothing is tracked.
        **options: Keyword options of the native Cockpit (``on_error``, ``log``,
            ``backend``, ``sinks``, ...), see :class:`cockpit_core.Cockpit`.

    Raises:
        ValueError: A quantity is neither a compat nor a native quantity instance.

    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        quantities: Iterable[Any] | None = None,
        **options: Any,
    ):
        self._entries: dict[str, _Entry] = {}
        registry = options.get("registry")
        self._registry: Registry = registry if registry is not None else default_registry()
        prepared = []
        for quantity in quantities or []:
            native, entry = self._prepare(quantity)
            self._entries[entry.native_key] = entry
            prepared.append((native, entry))
        sinks = [*options.pop("sinks", ()), self._print_verbose]
        self._native = NativeCockpit(
            params, quantities=[q for q, _ in prepared], sinks=sinks, **options
        )
        for _, entry in prepared:
            self._bind(entry)

    # -- quantities -----------------------------------------------------------------------

    def _prepare(self, quantity: Any) -> tuple[Any, _Entry]:
        """The native quantity for ``quantity`` and its entry (not registered yet)."""
        if isinstance(quantity, Quantity):
            name, cls_name = quantity.native_name, type(quantity).__name__
            native_key, legacy_key, k = name, cls_name, 2
            while native_key in self._entries:  # 1.0.2 keyed by class name: both would collide
                native_key, legacy_key, k = f"{name}_{k}", f"{cls_name}_{k}", k + 1
            label = None if native_key == name else native_key
            native = quantity.to_native(self._registry, label=label)
            return native, _Entry(quantity, native_key, legacy_key)
        if is_native_quantity(quantity):
            if quantity.key in self._entries:
                raise ValueError(
                    f"Two quantities write the output key '{quantity.key}'; give the native "
                    "quantity another label."
                )
            return quantity, _Entry(quantity, quantity.key, quantity.key)
        raise ValueError(
            f"Added quantities must be instances of Quantity (cockpit_compat.quantities "
            f"or native cockpit_core quantities). Got {quantity!r}."
        )

    def _bind(self, entry: _Entry) -> None:
        if isinstance(entry.quantity, Quantity):
            entry.quantity.bind(self, entry.legacy_key)

    def add(self, quantity: Any) -> None:
        """Track one more quantity from the next step on (call it between steps).

        Raises:
            ValueError: ``quantity`` is not a quantity instance, or its native options
                are invalid.

        """
        native, entry = self._prepare(quantity)
        self._native.add(native)
        self._entries[entry.native_key] = entry
        self._bind(entry)

    @property
    def quantities(self) -> list[Any]:
        """The tracked quantities, in the order they were given or added."""
        return [entry.quantity for entry in self._entries.values()]

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The tracked parameters."""
        return list(self._native.params)

    @property
    def native(self) -> NativeCockpit:
        """The native Cockpit that computes everything (its output uses native names)."""
        return self._native

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Failures of quantities recorded by the native Cockpit (it keeps training)."""
        return self._native.errors

    # -- the training loop ----------------------------------------------------------------

    def create_graph(self, global_step: int) -> bool:
        """Whether ``backward`` must keep the graph at ``global_step`` (a quantity needs HVPs).

        Pass it as ``loss.backward(create_graph=cockpit.create_graph(global_step))``.
        """
        return self._native.create_graph(global_step)

    def __call__(
        self,
        global_step: int,
        *exts: Any,
        info: Mapping[str, Any] | None = None,
        debug: bool = False,
    ) -> _Step:
        """Context manager around ``loss.backward()`` of ``global_step``.

        Args:
            global_step: The step number.
            *exts: BackPACK extensions to compute on top (results stay on the parameters,
                e.g. ``p.diag_h``).
            info: ``loss``, ``individual_losses``, ``batch_size``, ``optimizer``, as the
                quantities need.
            debug: Print what is computed at this step (native ``debug``).

        Raises:
            cockpit_core.MisuseError: No statistics provider accepts one of ``exts``.
            cockpit_core.RequirementConflictError: An extension differs from one a
                quantity needs only in its hyperparameters.

        """
        ctx = self._native(global_step, *exts, info=info)
        return _Step(self._native, ctx, debug)

    def log(
        self,
        global_step: int,
        epoch_count: Any,
        train_loss: Any,
        valid_loss: Any,
        test_loss: Any,
        train_accuracy: Any,
        valid_accuracy: Any,
        test_accuracy: Any,
        learning_rate: Any,
    ) -> None:
        """Record the metrics of an epoch under ``global_step`` (native ``log``).

        They appear in ``get_output()[global_step]`` under their argument names; ``None``
        means not measured (nothing is recorded for it).
        """
        values = (
            epoch_count,
            train_loss,
            valid_loss,
            test_loss,
            train_accuracy,
            valid_accuracy,
            test_accuracy,
            learning_rate,
        )
        self._native.log(global_step, **dict(zip(LOG_NAMES, values)))

    # -- output ---------------------------------------------------------------------------

    def get_output(self) -> defaultdict[int, dict[str, Any]]:
        """``{step: {ClassName: value, log name: value}}`` in Cockpit 1.0.2's layout.

        Values are converted from the native output on every call (the layouts are listed
        in ``docs/migrating.md``); steps without values are left out.
        """
        out: defaultdict[int, dict[str, Any]] = defaultdict(dict)
        for step, values in self._native.get_output().items():
            row: dict[str, Any] = {}
            for key, value in values.items():
                if value is None:
                    continue
                if key == METRICS_KEY and isinstance(value, Mapping):
                    row.update(value)
                    continue
                entry = self._entries.get(key)
                if entry is None:  # not from a quantity given here: keep it as it is
                    row[key] = value
                    continue
                legacy = entry.convert(value, step)
                if legacy is not DROP:
                    row[entry.legacy_key] = legacy
            if row:
                out[step] = row
        return out

    @property
    def output(self) -> defaultdict[int, dict[str, Any]]:
        """Same as :meth:`get_output`."""
        return self.get_output()

    def write(self, logpath: str | os.PathLike[str]) -> Path:
        """Write :meth:`get_output` to ``logpath + ".json"``.

        The file has Cockpit 1.0.2's layout (``{"step": {ClassName: value}}``, numpy
        arrays as json-tricks ``__ndarray__`` entries), written atomically; folders are
        created. Read it with :class:`~cockpit_compat.CockpitPlotter` or json-tricks.

        Returns:
            The path of the written file.

        """
        path = Path(f"{os.fspath(logpath)}.json")
        payload = {str(step): row for step, row in self.get_output().items()}
        return write_json_atomic(path, payload)

    def _print_verbose(self, record: Mapping[str, Any]) -> None:
        """Sink of the native Cockpit: print values of quantities created with ``verbose``."""
        if record.get("kind") != "values" or not isinstance(record.get("values"), Mapping):
            return
        step = record.get("step")
        for key, value in record["values"].items():
            entry = self._entries.get(key)
            if entry is None or not isinstance(entry.quantity, Quantity):
                continue
            if not entry.quantity.verbose or value is None:
                continue
            legacy = entry.convert(value, step)  # type: ignore[arg-type]
            if legacy is not DROP:
                print(f"[Step {step} | {entry.legacy_key}]: Store iteration {step}, value {legacy}")


class _Step:
    """The ``with cockpit(step, ...)`` block: the native step, with ``debug`` switched on."""

    def __init__(self, native: NativeCockpit, ctx: Any, debug: bool):
        self._native, self._ctx, self._debug = native, ctx, bool(debug)
        self._previous = native.debug

    def __enter__(self) -> Any:
        self._previous = self._native.debug
        self._native.debug = self._previous or self._debug
        try:
            return self._ctx.__enter__()
        except BaseException:
            self._native.debug = self._previous
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self._ctx.__exit__(*exc)
        finally:
            self._native.debug = self._previous
