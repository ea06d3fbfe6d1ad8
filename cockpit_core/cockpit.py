"""The :class:`Cockpit`: tracks the configured quantities during training."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from cockpit_core import checks
from cockpit_core.attention import MathAttentionHooks
from cockpit_core.cache import Cache
from cockpit_core.config import (
    QuantitySpec,
    load_config_file,
    parse_settings,
    resolve_quantities,
)
from cockpit_core.config_quantities import quantity_entry, resolve_added_quantity
from cockpit_core.coverage import CoverageReport, check_model
from cockpit_core.distributed import Distributed, active_group, writes_here
from cockpit_core.error_policy import ErrorPolicy
from cockpit_core.errors import CockpitWarning, ConfigError, MissingInfoError, MisuseError
from cockpit_core.log import LogWriter
from cockpit_core.metrics import METRICS_KEY, clean_metrics
from cockpit_core.normalize import check_unique_keys, split_params
from cockpit_core.planner import Planner
from cockpit_core.quantity import Quantity
from cockpit_core.registry import Registry, default_registry
from cockpit_core.statistics.router import StatisticsRouter
from cockpit_core.step import StepRun

Record = dict[str, Any]
Sink = Callable[[Record], None]


class Cockpit:
    """Track quantities of a training run.

    Args:
        params: The model's parameters: ``model.parameters()``, ``model.named_parameters()``
            (names then appear in messages and logs) or the model itself (then it is
            attached: :meth:`attach` without a per-sample loss).
        quantities: A preset name (``"economy"``, ``"business"``, ``"full"``), or a list of
            quantity names, presets, option dicts (``{"name": "hess_max_ev", "every": 10}``),
            Quantity classes or instances.
        on_error: What to do when a quantity raises: ``"warn"`` (record the error, warn,
            keep tracking), ``"disable"`` (record, warn, stop tracking it) or ``"raise"``.
        debug: Print what is computed at each step.
        log: Path of a JSON Lines log that receives each record as it is computed; an
            existing log is appended to as a new run (a torn last line is cut off first),
            never truncated (``docs/log_format.md``).
        log_fsync_every: Seconds between fsyncs of the log (``0``: every record, ``None``:
            never); each record is flushed regardless, so a killed process loses nothing.
        sinks: More destinations for every record: names of sinks registered by plugins
            (``"tensorboard"``), dicts with options (``{"name": "tensorboard", "log_dir":
            "runs/tb"}``) or callables ``sink(record)``.
        live_plot: Path of a dashboard picture refreshed every ``live_every`` steps while
            training runs (see :class:`cockpit_core.dashboard.LivePlot`).
        live_every: Steps between refreshes of ``live_plot``.
        backend: Which statistics providers compute the statistics: ``"auto"`` (for each
            parameter and statistic the cheapest installed provider that supports it: module
            hooks, then BackPACK, then ``torch.func``), a provider name (``"hooks"``,
            ``"backpack"``, ``"func"``) or a list of names in order of preference. See
            ``docs/any_model.md`` and ``docs/providers.md``.
        chunk_size: Samples per ``torch.func`` pass (bounds its memory; ``None``: the batch).
        keep_in_memory: Keep values for :meth:`get_output`; ``False`` only streams them
            (records the log cannot write yet, e.g. on a full disk, then exist only in its
            bounded buffer).
        distributed: ``"auto"``: under ``torch.distributed`` with several processes, every
            quantity describes the global batch (see ``docs/distributed.md``); ``"off"``:
            each process reports its own mini-batch.
        write_on: ``"rank0"``: only process 0 writes the log, sinks and live plot;
            ``"all"``: every process does (give each its own ``log`` path).
        registry: Plugins to resolve names with (default: every installed plugin).

    Example::

        cp = Cockpit(model.named_parameters(), quantities=["loss", "grad_norm"])
        for step, (x, y) in enumerate(loader):
            opt.zero_grad()
            losses = loss_fn_per_sample(model(x), y)
            loss = losses.mean()
            with cp(step, info={"loss": loss, "individual_losses": losses,
                                "batch_size": len(x), "optimizer": opt}):
                loss.backward(retain_graph=cp.retain_graph(step))
            opt.step()
        cp.get_output()   # {step: {"loss": ..., "grad_norm": ...}}

    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter]
        | Iterable[tuple[str, torch.nn.Parameter]]
        | torch.nn.Module,
        quantities: QuantitySpec | Iterable[QuantitySpec] = "economy",
        *,
        on_error: str = "warn",
        debug: bool = False,
        log: str | Path | None = None,
        keep_in_memory: bool = True,
        registry: Registry | None = None,
        log_fsync_every: float | None = 5.0,
        sinks: Iterable[Any] = (),
        live_plot: str | Path | None = None,
        live_every: int = 50,
        backend: str = "auto",
        chunk_size: int | None = None,
        distributed: str = "auto",
        write_on: str = "rank0",
        _source: str | None = None,
    ):
        parse_settings(
            {
                "on_error": on_error,
                "debug": debug,
                "keep_in_memory": keep_in_memory,
                "log": None if log is None else str(log),
                "log_fsync_every": log_fsync_every,
                "live_every": live_every,
                "backend": backend,
                "chunk_size": chunk_size,
                "distributed": distributed,
                "write_on": write_on,
            },
            _source,
        )
        self.registry = registry if registry is not None else default_registry()
        model = params if isinstance(params, torch.nn.Module) else None
        self.params, self.param_names = split_params(params)
        self.quantities: list[Quantity] = resolve_quantities(quantities, self.registry, _source)
        check_unique_keys(self.quantities, _source)
        self.on_error = on_error
        self.debug = debug
        self.keep_in_memory = keep_in_memory
        self.sinks: list[Sink] = []
        group = active_group(distributed)
        self._dist = Distributed(group) if group is not None else None
        if not writes_here(write_on):  # another process writes
            log, sinks, live_plot = None, (), None
        extra_sinks = [self.registry.make_sink(spec) for spec in sinks]  # fail before any I/O
        if live_plot is not None:
            from cockpit_core.dashboard import LivePlot

            extra_sinks.append(LivePlot(live_plot, every=live_every, registry=self.registry))
        try:
            self._log = LogWriter(log, fsync_every=log_fsync_every) if log is not None else None
        except (OSError, ValueError) as err:
            raise ConfigError(
                [("log", f"cannot open the log file {log!r}: {err}")], _source
            ) from None
        if self._log is not None:
            self.sinks.append(self._log)
        self.sinks.extend(extra_sinks)
        try:
            self._backend = StatisticsRouter(
                self.params,
                self.param_names,
                {name: entry.cls for name, entry in self.registry.providers.items()},
                backend,
                {"chunk_size": chunk_size},
            )
        except ConfigError as err:
            raise ConfigError(err.errors, _source) from None
        if model is not None:
            self._backend.attach(model)
        self._warn_unprovided_kinds()
        self._attention_hooks: MathAttentionHooks | None = None
        self._math_attention = False
        self._cache = Cache()
        self._output: dict[int, dict[str, Any]] = {}
        self._planner = Planner(self.quantities, self._backend)
        self._policy = ErrorPolicy(on_error, self._emit, self._planner, self._cache)
        self._planner.report = self._policy.quantity_failed  # raising schedules, requirements
        self._watch = checks.ParameterWatch(self.params, self.param_names)
        self._batch_norm_checked = False
        self._last_step: int | None = None
        self._in_step = False
        self._info_checked = False
        self._info_unchecked: list[Quantity] = []  # added by add(): check at the next step
        self._added_at: dict[str, int] = {}  # key of an added quantity -> its first step
        self._active_step: int | None = None  # the step of the active with block
        self._emit({"kind": "header", **self.header()})

    # -- construction helpers -------------------------------------------------------------

    @classmethod
    def from_config(
        cls,
        config: str | Path | Mapping[str, Any],
        params: Any,
        registry: Registry | None = None,
        **overrides: Any,
    ) -> Cockpit:
        """Build a Cockpit from a TOML/YAML/JSON file or a dict (see ``docs/configuration.md``).

        Keyword ``overrides`` replace options of the file.
        """
        source = None
        if isinstance(config, (str, Path)):
            source = str(config)
            data = load_config_file(config)
        else:
            data = dict(config)
        data.update(overrides)
        settings = parse_settings(
            data, source, registry if registry is not None else default_registry()
        )
        return cls(
            params,
            settings.quantities,
            on_error=settings.on_error,
            debug=settings.debug,
            log=settings.log,
            keep_in_memory=settings.keep_in_memory,
            log_fsync_every=settings.log_fsync_every,
            sinks=settings.sinks,
            live_plot=settings.live_plot,
            live_every=settings.live_every,
            backend=settings.backend,
            chunk_size=settings.chunk_size,
            distributed=settings.distributed,
            write_on=settings.write_on,
            registry=registry,
            _source=source,
        )

    def header(self) -> Record:
        """Versions of the core and plugins, the quantities and a parameter summary."""
        from cockpit_core import __version__

        return {
            "cockpit_core": __version__,
            "plugins": {p.distribution: p.version for p in self.registry.plugins if p.ok},
            "quantities": [
                {
                    **quantity_entry(q),
                    **({"added_at": self._added_at[q.key]} if q.key in self._added_at else {}),
                }
                for q in self.quantities
            ],
            "params": [
                {"name": n, "shape": list(p.shape), "numel": p.numel()}
                for n, p in zip(self.param_names, self.params)
            ],
        }

    # -- the training-loop API ------------------------------------------------------------

    def __call__(
        self,
        step: int,
        *requests: Any,
        info: Mapping[str, Any] | None = None,
        accumulate: bool = False,
    ) -> contextlib.AbstractContextManager:
        """Context manager around ``loss.backward()`` for ``step``.

        ``requests`` are computed in the same backward pass by the statistics provider
        that accepts them, e.g. BackPACK extensions, as in Cockpit 1.0.2's
        ``cockpit(step, DiagGGNExact(), info=...)``: their results stay on the parameters
        after the step (``p.diag_ggn_exact``). One the quantities also need (same class,
        same hyperparameters) is computed once; one that differs only in its
        hyperparameters raises ``RequirementConflictError`` (``docs/quickstart.md``).

        With ``accumulate=True`` the step spans several micro-batches (gradient
        accumulation): wrap each micro-batch's ``backward()`` in ``run.micro_batch(info)``
        where ``run`` is what the ``with`` statement binds (``docs/distributed.md``).

        Raises:
            MisuseError: No installed provider accepts one of ``requests`` (on entry).

        """
        return StepRun(self, step, dict(info or {}), accumulate=accumulate, requests=requests)

    def retain_graph(self, step: int) -> bool:
        """Whether ``backward`` must keep the graph at ``step`` (a quantity needs HVPs)."""
        return self._planner.plan(step)[1].loss_graph

    def create_graph(self, step: int) -> bool:
        """Cockpit 1.0.2 spelling of :meth:`retain_graph`.

        Passing it to ``backward(create_graph=...)`` works (the gradient graph is detached
        after the step, so nothing leaks), but PyTorch then warns about a reference cycle;
        prefer ``loss.backward(retain_graph=cp.retain_graph(step))``.
        """
        return self.retain_graph(step)

    def prepare(self, step: int, *requests: Any) -> None:
        """Arm the statistics providers that observe the forward pass of ``step``.

        Providers that record layer inputs during the forward pass (module hooks,
        BackPACK) cost time and memory on every pass they observe, so after each step the
        Cockpit arms them only if the next step (the last step plus the last stride
        between steps) needs their statistics. Loops whose step numbers are evenly spaced
        never need to call this; call it before the forward pass when the next step number
        cannot be predicted.

        ``requests`` (those later passed to ``cp(step, *requests)``) arm the providers that
        accept them for every parameter, for the rest of the run: call it once before the
        forward pass of the first step that passes them, if their provider was not armed
        yet (a warning at that step says so).

        Raises:
            MisuseError: No installed provider accepts one of ``requests``.

        """
        self._backend.request(requests, where=f"cp.prepare({step}, ...)")
        self._planner.prepare(step)

    def add(self, quantity: QuantitySpec) -> Quantity:
        """Track one more quantity from the next step on.

        ``quantity`` is what an entry of the constructor's ``quantities`` list may be,
        except a preset: a name (``"grad_norm"``), an option dict (``{"name":
        "hess_max_ev", "every": 10}``), a Quantity class or instance, validated the same
        way. Call it between steps, before the forward pass of the next step, so that the
        statistics providers observe that pass; under ``torch.distributed`` call it on
        every process. The ``info`` keys it needs are checked when the next step begins.
        The log gets a ``quantity_added`` record and the header (of :meth:`header`,
        :meth:`write`, ``read_run``) lists the quantity with ``added_at``, the first step
        it applies to (``docs/log_format.md``).

        Returns:
            The resolved quantity; its values appear under its ``key``.

        Raises:
            ConfigError: Unknown name (with the closest installed one), bad options, a
                preset, or an output key that a tracked quantity already writes (or the
                reserved key ``"metrics"``); nothing is added.
            MisuseError: Called inside a ``with cp(step, ...)`` block.

        """
        if self._in_step:
            raise MisuseError(
                f"cp.add(...) called inside the `with cp({self._active_step}, ...)` block: add "
                "quantities between steps (after the block, before the next forward pass); "
                "they are tracked from the next step on."
            )
        q = resolve_added_quantity(quantity, self.quantities, self.registry)
        self._warn_unprovided_kinds([q])  # asks for its requirements before anything changes
        step = 0 if self._last_step is None else self._last_step + 1
        self.quantities.append(q)
        self._planner.add(q)
        self._added_at[q.key] = step
        self._info_unchecked.append(q)
        model = self._backend.model
        if self._math_attention and self._attention_hooks is None and model is not None:
            if any(r.loss_graph for r in q.all_requirements()):
                self._attention_hooks = MathAttentionHooks(
                    model, lambda: not self._disabled_all_hvp()
                )
        self._emit({"kind": "quantity_added", "step": step, "quantity": quantity_entry(q)})
        return q

    def log(self, step: int, **metrics: Any) -> None:
        """Record metrics that the training script measured, e.g. once per epoch.

        Cockpit 1.0.2's names (``epoch_count``, ``train_loss``, ``valid_loss``,
        ``test_loss``, ``train_accuracy``, ``valid_accuracy``, ``test_accuracy``,
        ``learning_rate``) are drawn by the dashboard's *Performance* panel; any other
        name is kept as well. Several calls at one step merge (a later value of a name
        replaces the earlier one). Allowed at any time except inside the ``with
        cp(...)`` block of another step. See ``docs/quickstart.md``.

        Metrics land in ``cp.get_output()[step]["metrics"]`` and reach the log and every
        sink as ``{"kind": "metrics", "step": step, "metrics": {name: value}}``.

        Args:
            step: The global step the metrics belong to (need not be a tracked step).
            **metrics: ``name=value`` with an int, a float, a numpy number, a 0-d tensor
                (logged as a float) or ``None`` (not measured: nothing is recorded for it).

        Raises:
            TypeError: A value is not one of those (bools, strings, arrays are refused);
                nothing of the call is logged.
            MisuseError: ``step`` is not an integer, no metric was given, or the call is
                inside the ``with cp(...)`` block of another step.

        """
        step, measured = clean_metrics(step, metrics)
        if self._in_step and step != self._active_step:
            raise MisuseError(
                f"cp.log({step}, ...) called inside the `with cp({self._active_step}, ...)` "
                f"block: log metrics of step {step} outside that block, or pass step "
                f"{self._active_step}."
            )
        if not measured:
            return
        if self.keep_in_memory:
            row = self._output.setdefault(step, {})
            row[METRICS_KEY] = {**row.get(METRICS_KEY, {}), **measured}
        self._emit({"kind": "metrics", "step": step, "metrics": dict(measured)})

    def attach(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        *,
        math_attention: bool = True,
    ) -> Cockpit:
        """Register the model (and a per-sample loss): statistics for any model.

        Knowing the model, cockpit routes each parameter to the cheapest provider that
        supports its module: module hooks (``cockpit-hooks``: linear layers with any
        leading dimensions, embeddings, normalization layers, convolutions, attention),
        BackPACK, and ``torch.func`` for everything else. ``torch.func`` needs
        ``loss_fn`` and the batch at every step: ``info={"inputs": x, "targets": y,
        ...}``. ``cp.check(model)`` shows the routes. See ``docs/any_model.md``.

        Args:
            model: The module whose forward pass produced the loss; it must own every
                tracked parameter.
            loss_fn: ``loss_fn(outputs, targets)`` on a batch returning the per-sample losses
                ``[B]`` (e.g. ``torch.nn.CrossEntropyLoss(reduction="none")``) or their mean
                (a mean-reduced loss evaluated on one sample is that sample's loss). Without
                ``info["targets"]`` it is called as ``loss_fn(outputs)``. Only the
                ``torch.func`` provider needs it.
            math_attention: While a tracked quantity needs Hessian-vector products, run
                the model's ``scaled_dot_product_attention`` in the math kernel (fused
                kernels have no double backward).

        Returns:
            The Cockpit itself.

        Raises:
            MisuseError: ``model`` is not a module, does not own every tracked parameter,
                or ``loss_fn`` is not callable.

        """
        if not isinstance(model, torch.nn.Module):
            raise MisuseError(
                f"cp.attach(model, loss_fn) needs a torch.nn.Module, got {type(model).__name__}."
            )
        if loss_fn is not None and not callable(loss_fn):
            raise MisuseError(
                "cp.attach(model, loss_fn): loss_fn must be callable as loss_fn(outputs, "
                "targets), e.g. torch.nn.CrossEntropyLoss(reduction='none')."
            )
        self._backend.attach(model, loss_fn)
        self._planner.prepare(self._last_step + 1 if self._last_step is not None else 0)
        if self._attention_hooks is not None:
            self._attention_hooks.remove()
            self._attention_hooks = None
        uses_hvp = any(r.loss_graph for q in self.quantities for r in q.all_requirements())
        self._math_attention = math_attention
        if math_attention and uses_hvp:
            self._attention_hooks = MathAttentionHooks(model, lambda: not self._disabled_all_hvp())
        return self

    def _disabled_all_hvp(self) -> bool:
        return all(
            q.key in self._planner.disabled or not any(r.loss_graph for r in q.all_requirements())
            for q in self.quantities
        )

    def check(self, model: torch.nn.Module) -> CoverageReport:
        """Report, per quantity, whether it can be computed for ``model``, how, and why not.

        ``print(cp.check(model))`` before training shows, per quantity, which providers
        compute its statistics and, per parameter, why cheaper providers cannot (e.g. no
        rule for its module), so no step is wasted on quantities that cannot run. If no
        model was attached, ``model`` is attached (:meth:`attach` without a loss).
        Per-sample quantities are unavailable while a tracked BatchNorm layer is in
        training mode (per-sample gradients are not defined there).
        """
        if self._backend.model is not model:  # routing needs it; arm its providers too
            self.attach(model, self._backend.loss_fn if self._backend.model is None else None)
        report = check_model(self.quantities, model, self._backend, self._math_attention)
        return self._refuse_batch_norm(report, model)

    def _refuse_batch_norm(self, report: CoverageReport, model: torch.nn.Module) -> CoverageReport:
        """Per-sample quantities are unavailable while tracked BatchNorm layers train."""
        tracked = {id(p) for p in self.params}
        modules = [
            name or type(m).__name__
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
            and m.training
            and any(id(p) in tracked for p in m.parameters(recurse=False))
        ]
        if not modules:
            return report
        per_sample = {
            q.key
            for q in self.quantities
            if any(s.per_sample for r in q.all_requirements() for s in r.statistics)
        }
        why = f"BatchNorm module(s) {checks.names_text(modules)}: {checks.BATCH_NORM_REASON}"
        hint = "Use GroupNorm/LayerNorm, or track these quantities with the model in eval mode."
        rows = tuple(
            dataclasses.replace(row, available=False, why=why, hint=hint)
            if row.available and row.quantity in per_sample
            else row
            for row in report.rows
        )
        return dataclasses.replace(report, rows=rows)

    @property
    def errors(self) -> list[Record]:
        """Failures of quantities: step, quantity, phase, message, traceback summary."""
        return self._policy.errors

    @property
    def skipped(self) -> list[Record]:
        """Steps whose quantities did not run, and why.

        A non-finite loss or gradient (also a ``GradScaler``'s overflow), or no
        ``backward()`` inside the block.
        """
        return self._policy.skipped

    def get_output(self) -> dict[int, dict[str, Any]]:
        """All values tracked so far as ``{step: {quantity_key: value}}``.

        Metrics logged with :meth:`log` are under the reserved key ``"metrics"``:
        ``{step: {..., "metrics": {name: value}}}``.
        """
        return {s: dict(v) for s, v in sorted(self._output.items())}

    def write(self, path: str | Path) -> Path:
        """Write one consolidated JSON file (header, values, errors); read it with ``read_log``.

        The write is atomic: a temporary file in the same folder is written, flushed,
        fsync-ed and renamed over ``path``, so a process killed meanwhile leaves the
        previous file intact. Any value can be written (see ``docs/log_format.md``).
        """
        from cockpit_core.log import write_json_atomic

        payload = {
            "header": self.header(),
            "output": {str(s): v for s, v in self.get_output().items()},
            "errors": self.errors,
            "skipped": self.skipped,
        }
        return write_json_atomic(path, payload)

    def close(self) -> None:
        """Flush and close the log and every sink that has a ``close()`` method."""
        self._planner.close()
        for sink in list(self.sinks):
            close = getattr(sink, "close", None)
            if callable(close):
                try:
                    close()
                except (KeyboardInterrupt, GeneratorExit):
                    raise
                except BaseException as err:  # plugin code: one sink must not skip the others
                    warnings.warn(
                        f"cockpit: closing sink {sink!r} failed: {err} ({type(err).__name__})",
                        CockpitWarning,
                        stacklevel=2,
                    )

    def plot(self, path: str | Path | None = None, **options: Any) -> Any:
        """Render the dashboard of what was tracked so far (``.png``, ``.svg`` or ``.pdf``).

        Returns ``path`` when given, else the matplotlib figure. ``options`` go to
        :func:`cockpit_core.dashboard.render` (``title``, ``rows``, ``dpi``, ...).
        """
        from cockpit_core.dashboard import plot

        return plot(self, path, **options)

    # -- checks ---------------------------------------------------------------------------

    def _warn_unprovided_kinds(self, quantities: Iterable[Quantity] | None = None) -> None:
        """Warn now about statistics that no installed provider computes at all."""
        providers = self._backend.providers.values()
        for q in self.quantities if quantities is None else quantities:
            for stat in {
                s.identity: s for r in q.all_requirements() for s in r.statistics
            }.values():
                if any(p.delivers(stat.kind) for p in providers):
                    continue
                hint = getattr(stat.kind, "install_hint", "")
                warnings.warn(
                    f"cockpit: no installed statistics provider computes {stat.describe()}, "
                    f"which '{q.key}' needs; it will record an error at every tracked step."
                    + (f" Hint: {hint}." if hint else ""),
                    CockpitWarning,
                    stacklevel=3,
                )

    def _check_info(self, info: Mapping[str, Any], quantities: Iterable[Quantity]) -> None:
        """Raise :class:`MissingInfoError` if ``info`` lacks a key the quantities need.

        Quantities added with :meth:`add` since the last check are checked too, whether
        they run at this step or not (as the first step checks every quantity).
        """
        problems = []
        quantities = list(quantities)
        added = [q for q in self._info_unchecked if all(q is not t for t in quantities)]
        for q in quantities + added:
            try:
                needed = set(q.required_info())
                per_sample = any(s.per_sample for r in q.all_requirements() for s in r.statistics)
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException:  # plugin code: the planner records it when it plans the step
                continue
            if per_sample and "individual_losses" not in info:
                needed.add("batch_size")
            added_by = " (added with cp.add)" if q.key in self._added_at else ""
            for key in sorted(needed - set(info)):
                problems.append(f"'{q.key}'{added_by} needs info['{key}']")
        if problems:
            raise MissingInfoError(
                "Missing info keys: " + "; ".join(problems) + ". Pass them at every step: "
                "with cp(step, info={...}). Common keys: loss, individual_losses, "
                "batch_size, optimizer."
            )
        self._info_unchecked = []

    # -- running a step -------------------------------------------------------------------

    def _warn_misuse(self, info: Mapping[str, Any]) -> None:
        for message in (
            checks.optimizer_mismatch(info.get("optimizer"), self.params),
            checks.reduction_mismatch(info),
        ):
            if message:
                warnings.warn(f"cockpit: {message}", CockpitWarning, stacklevel=4)

    def _emit(self, record: Record) -> None:
        for sink in list(self.sinks):
            try:
                sink(record)
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException as err:  # a broken sink (even SystemExit) must not stop training
                self.sinks.remove(sink)
                warnings.warn(
                    f"cockpit: sink {sink!r} failed and was removed: {err} ({type(err).__name__})",
                    CockpitWarning,
                    stacklevel=3,
                )
        if record.get("kind") != "values" or not isinstance(record.get("values"), dict):
            return
        from cockpit_core.log import unserializable_notes

        step = record.get("step")
        for key, value in record["values"].items():
            notes = unserializable_notes(value)
            if not notes:
                continue
            more = f"; and {len(notes) - 3} more" if len(notes) > 3 else ""
            shown = "; ".join(notes[:3]) + more
            error = {
                "kind": "error",
                "step": step,
                "quantity": key,
                "phase": "serialize",
                "error": f"UnserializableValue: {shown}",
                "traceback": [],
            }
            self._policy.errors.append(error)
            self._emit(error)
            self._policy.warn_once(
                (key, "unserializable"),
                f"the value of quantity '{key}' at step {step} cannot be logged as it is "
                f"({shown}); training continues. The error (phase 'serialize') is in "
                "cp.errors and the log; see docs/log_format.md for what can be logged.",
                stacklevel=6,  # user's with block > StepRun.__exit__ > run_tasks > _emit
            )
