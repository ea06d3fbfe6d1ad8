"""The :class:`Cockpit`: tracks the configured quantities during training."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from cockpit_core.check.coverage import (
    CoverageReport,
    check_model,
    refuse_batch_norm,
    warn_forward_pass_without_model,
    warn_unprovided_kinds,
)
from cockpit_core.check.run import run_sample_step
from cockpit_core.check.sample import Sample, sample_spec
from cockpit_core.config.files import (
    CockpitSettings,
    QuantitySpec,
    load_config_file,
    parse_settings,
    resolve_quantities,
)
from cockpit_core.config.quantities import (
    check_unique_keys,
    quantity_entry,
    resolve_added_quantity,
)
from cockpit_core.diagnosing.build import build_diagnoses
from cockpit_core.diagnosing.runner import DiagnosisRunner
from cockpit_core.diagnosing.triggers import running_names
from cockpit_core.diagnosis import Finding
from cockpit_core.distributed.batch import Distributed, active_group, writes_here
from cockpit_core.engine.attention import MathAttentionHooks
from cockpit_core.engine.compiled import uncompiled
from cockpit_core.engine.metrics import METRICS_KEY, clean_metrics
from cockpit_core.engine.normalize import split_params
from cockpit_core.engine.state import LoadReport, load_state, save_state
from cockpit_core.engine.step import StepRun
from cockpit_core.engine.tracker import Record, Sink, Tracker
from cockpit_core.errors import ConfigError, MisuseError
from cockpit_core.hookspecs import LIVE_PLOT_SINK
from cockpit_core.log import LogWriter, write_json_atomic
from cockpit_core.observe import ForwardObserver, LossSpec, loss_spec
from cockpit_core.plugin.discovery import core_version
from cockpit_core.plugin.registry import Registry, default_registry
from cockpit_core.quantity import Quantity, ResumeContext
from cockpit_core.statistics.router import StatisticsRouter

_PYTHON_OBJECTS = ("quantities", "sinks", "live_plot")
"""Settings that may hold Python objects in the constructor; checked when they are resolved."""

TRAINING_OBJECTS = ("loss_fn", "optimizer")
"""Constructor arguments that are objects of the training script, like the model, not
settings: no config file holds them (:meth:`Cockpit.from_config` passes them through)."""


class Cockpit:
    """Track quantities of a training run.

    Args:
        params: The model's parameters: ``model.parameters()``, ``model.named_parameters()``
            (names then appear in messages and logs) or the model itself (then it is
            attached, :meth:`attach`, and cockpit observes its forward passes: the batch
            size, the targets and, with ``loss_fn``, the per-sample losses of each step).
        quantities: A preset name (``"economy"``, ``"business"``, ``"full"``), or a list of
            quantity names, presets, option dicts (``{"name": "hess_max_ev", "every": 10}``),
            Quantity classes or instances.
        loss_fn: The loss of training, so that cockpit computes the per-sample losses
            ``info["individual_losses"]`` itself (needs the model as ``params``): the loss
            module the loop calls (``nn.CrossEntropyLoss()``, ``nn.MSELoss()``,
            ``nn.BCEWithLogitsLoss()``, any module with a ``reduction`` attribute; its
            calls are observed), a name (``"cross_entropy"``, ``"causal_lm"``, ``"mse"``,
            ``"bce_with_logits"``: :mod:`cockpit_core.engine.losses`) or a callable
            ``loss_fn(outputs, targets)`` returning the per-sample losses ``[B]``. It also
            serves the ``torch.func`` provider (:meth:`attach`). See
            ``docs/quickstart.md``.
        optimizer: The training optimizer (``info["optimizer"]`` at every step).
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
            training runs: the sink ``live_plot`` (:data:`~cockpit_core.hookspecs.LIVE_PLOT_SINK`),
            which cockpit-dashboard registers.
        live_every: Steps between refreshes of ``live_plot``.
        backend: Which statistics providers compute the statistics: ``"auto"`` (for each
            parameter and statistic the cheapest installed provider that supports it: module
            hooks, then BackPACK, then ``torch.func``), a provider name (``"hooks"``,
            ``"backpack"``, ``"func"``) or a list of names in order of preference. See
            ``docs/any_model.md`` and ``docs/providers.md``.
        chunk_size: Samples per ``torch.func`` pass (bounds its memory; ``None``: the batch).
        provider_options: Options of individual providers by name, e.g.
            ``{"autodiff": {"max_hvps": 100_000}}`` (validated against each provider's
            ``options_model``; see ``docs/providers.md``).
        keep_in_memory: Keep values for :meth:`get_output`; ``False`` only streams them
            (records the log cannot write yet, e.g. on a full disk, then exist only in its
            bounded buffer).
        distributed: ``"auto"``: under ``torch.distributed`` with several processes, every
            quantity describes the global batch (see ``docs/distributed.md``); ``"off"``:
            each process reports its own mini-batch.
        write_on: ``"rank0"``: only process 0 writes the log, sinks and live plot;
            ``"all"``: every process does (give each its own ``log`` path).
        diagnoses: Diagnoses to run while training (``None``: none): names registered by
            plugins (``"stability"``) or dicts with options (``{"name": "step_size",
            "window": 20}``). Each finding becomes a ``finding`` record (the log, every
            sink) and a :class:`~cockpit_core.errors.CockpitWarning`, once per finding id
            (see ``docs/diagnoses.md``).
        registry: Plugins to resolve names with (default: every installed plugin).

    Example::

        loss_fn = torch.nn.CrossEntropyLoss()
        cp = Cockpit(model, "economy", loss_fn=loss_fn, optimizer=opt)
        for step, (x, y) in enumerate(loader):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            with cp(step, loss=loss):
                loss.backward()
            opt.step()
        cp.get_output()   # {step: {"loss": ..., "grad_norm": ...}}

    Everything the quantities need can also be passed at each step, as before:
    ``with cp(step, info={"loss": loss, "individual_losses": losses, "batch_size":
    len(x), "optimizer": opt}): loss.backward(retain_graph=cp.retain_graph(step))``.

    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter]
        | Iterable[tuple[str, torch.nn.Parameter]]
        | torch.nn.Module,
        quantities: QuantitySpec | Iterable[QuantitySpec] = "economy",
        *,
        loss_fn: str | Callable[..., torch.Tensor] | torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        on_error: str = "warn",
        debug: bool = False,
        log: str | Path | None = None,
        keep_in_memory: bool = True,
        registry: Registry | None = None,
        log_fsync_every: float | None = 5.0,
        sinks: Iterable[Any] = (),
        live_plot: str | Path | None = None,
        live_every: int = 50,
        backend: str | list[str] = "auto",
        chunk_size: int | None = None,
        provider_options: Mapping[str, Mapping[str, Any]] | None = None,
        distributed: str = "auto",
        write_on: str = "rank0",
        diagnoses: Iterable[str | Mapping[str, Any]] | None = None,
        _source: str | None = None,
    ):
        options = locals()  # the settings, declared once: CockpitSettings (config_settings.py)
        parse_settings(
            {
                name: str(options[name]) if name == "log" and log is not None else options[name]
                for name in CockpitSettings.model_fields
                if name not in _PYTHON_OBJECTS
            },
            _source,
        )
        self.registry = registry if registry is not None else default_registry()
        if isinstance(params, torch.nn.Module):  # torch.compile(model): the model's own names
            params = uncompiled(params)
        model = params if isinstance(params, torch.nn.Module) else None
        spec = _resolve_loss(loss_fn, "Cockpit(..., loss_fn=...)")
        if spec is not None and model is None:
            raise MisuseError(
                "Cockpit(..., loss_fn=...) needs the model, whose forward passes cockpit "
                "observes: pass Cockpit(model, ...) instead of its parameters, or call "
                "cp.attach(model, loss_fn)."
            )
        self._optimizer = _checked_optimizer(optimizer)
        self._loss_fn = loss_fn
        self.params, self.param_names = split_params(params)
        self.quantities: list[Quantity] = resolve_quantities(
            quantities, self.registry, _source, diagnoses=running_names(diagnoses)
        )
        check_unique_keys(self.quantities, _source)
        self.on_error = on_error
        self.keep_in_memory = keep_in_memory
        sink_list: list[Sink] = []
        group = active_group(distributed)
        dist = Distributed(group) if group is not None else None
        if not writes_here(write_on):  # another process writes (and diagnoses)
            log, sinks, live_plot, diagnoses = None, (), None, None
        extra_sinks = [self.registry.make_sink(spec) for spec in sinks]  # fail before any I/O
        wanted = list(diagnoses or ())
        runner = DiagnosisRunner(build_diagnoses(wanted, self.registry)) if wanted else None
        if live_plot is not None:  # the sink of that name (cockpit-dashboard registers it)
            live = {"name": LIVE_PLOT_SINK, "path": str(live_plot), "every": live_every}
            extra_sinks.append(self.registry.make_sink(live, path="live_plot"))
        try:
            router = StatisticsRouter(
                self.params,
                self.param_names,
                {name: entry.cls for name, entry in self.registry.providers.items()},
                backend,
                {"chunk_size": chunk_size},
                provider_options,
            )
        except ConfigError as err:
            raise ConfigError(err.errors, _source) from None
        observer = ForwardObserver()
        if model is not None:
            router.attach(model, spec.for_func if spec is not None else None)
            observer.attach(model, spec)
        self._router = router
        self._provider_settings: dict[str, Any] = {  # for the throwaway Cockpit of check
            "backend": backend,
            "chunk_size": chunk_size,
            "provider_options": provider_options,
        }
        warn_unprovided_kinds(self.quantities, router.providers.values())
        if model is None:
            warn_forward_pass_without_model(self.quantities)
        self._attention_hooks: MathAttentionHooks | None = None
        self._math_attention = False
        # the log last: opening it takes its one-writer lock, which a failed
        # construction must not keep
        try:
            self._log = LogWriter(log, fsync_every=log_fsync_every) if log is not None else None
        except (OSError, ValueError) as err:
            raise ConfigError(
                [("log", f"cannot open the log file {log!r}: {err}")], _source
            ) from None
        if self._log is not None:
            sink_list.append(self._log)
        sink_list.extend(extra_sinks)
        try:
            self._tracker = Tracker(
                self.params,
                self.param_names,
                self.quantities,
                router,
                on_error=on_error,
                sinks=sink_list,
                dist=dist,
                debug=debug,
                keep_in_memory=keep_in_memory,
                diagnoses=runner,
                observer=observer,
            )
            self._tracker.emit({"kind": "header", **self.header()})
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise
        if model is not None:  # attached as by attach(model): attention in the math kernel
            self._math_attention = True
            self._install_attention_hooks(model)

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

        Keyword ``overrides`` replace options of the file; ``loss_fn`` and ``optimizer``,
        objects of the training script, are passed to the constructor as they are.
        """
        source = None
        if isinstance(config, (str, Path)):
            source = str(config)
            data = load_config_file(config)
        else:
            data = dict(config)
        objects = {k: overrides.pop(k) for k in TRAINING_OBJECTS if k in overrides}
        data.update(overrides)
        settings = parse_settings(
            data, source, registry if registry is not None else default_registry()
        )
        options = {name: getattr(settings, name) for name in CockpitSettings.model_fields}
        return cls(params, **options, **objects, registry=registry, _source=source)

    def header(self) -> Record:
        """Versions of the core and plugins, the quantities and a parameter summary."""
        tracker = getattr(self, "_tracker", None)  # None while the constructor runs
        listed = self.quantities if tracker is None else tracker.listed
        return {
            "cockpit_core": core_version(),
            "plugins": {p.distribution: p.version for p in self.registry.plugins if p.ok},
            "quantities": [
                {**quantity_entry(q), **({} if tracker is None else tracker.marks(q))}
                for q in listed
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
        loss: torch.Tensor | None = None,
        info: Mapping[str, Any] | None = None,
        accumulate: bool = False,
    ) -> contextlib.AbstractContextManager[StepRun]:
        """Context manager around ``loss.backward()`` for ``step``.

        ``with cp(step, loss=loss): loss.backward()`` is all a loop needs when cockpit
        knows the model (``Cockpit(model, ...)``), the loss (``loss_fn=``, for quantities
        that need per-sample losses) and the optimizer (``optimizer=``): it takes the
        batch size, the targets and the per-sample losses from the step's forward pass
        (:mod:`cockpit_core.observe`), and keeps the graph for Hessian-vector products
        without ``retain_graph`` (:mod:`cockpit_core.engine.keep_graph`). ``cp(step, loss=loss,
        info={...})`` merges: ``info`` entries win key by key over what cockpit observed.
        ``cp(step, info={...})`` alone works as it always did: ``info`` (and the
        constructor's ``optimizer``) is all the step gets (``docs/quickstart.md``).

        A quantity whose ``info`` is incomplete: in the short form (``loss=`` given, or no
        ``info``), it fails at the step through ``on_error`` (recorded in
        :attr:`errors`, training continues; ``"raise"`` raises), with what cockpit could
        not observe and what to pass; with ``info=`` alone the block raises
        :class:`~cockpit_core.errors.MissingInfoError` when it begins, unless the quantity
        was added with :meth:`add` (which never stops training: it fails through
        ``on_error`` as in the short form).

        ``requests`` are computed in the same backward pass by the statistics provider
        that accepts them, e.g. BackPACK extensions, as in Cockpit 1.0.2's
        ``cockpit(step, DiagGGNExact(), info=...)``: their results stay on the parameters
        after the step (``p.diag_ggn_exact``). One the quantities also need (same class,
        same hyperparameters) is computed once; one that differs only in its
        hyperparameters raises ``RequirementConflictError`` (``docs/quickstart.md``).

        With ``accumulate=True`` the step spans several micro-batches (gradient
        accumulation): wrap each micro-batch's ``backward()`` in ``run.micro_batch(info)``
        where ``run`` is what the ``with`` statement binds (``docs/distributed.md``).

        Args:
            step: The global step number (increasing).
            *requests: Objects for the statistics providers (e.g. BackPACK extensions).
            loss: The loss ``backward()`` is called on (``info["loss"]``).
            info: What the quantities need, given explicitly (wins over what cockpit
                knows or observed).
            accumulate: The step spans several micro-batches.

        Raises:
            MisuseError: No installed provider accepts one of ``requests`` (on entry).

        """
        given = {"optimizer": self._optimizer} if self._optimizer is not None else {}
        return StepRun(
            self._tracker,
            step,
            dict(info or {}),
            accumulate=accumulate,
            requests=requests,
            attention=self._attention_hooks,
            loss=loss,
            given=given,
            lenient=loss is not None or info is None,
        )

    def retain_graph(self, step: int) -> bool:
        """Whether ``backward`` must keep the graph at ``step`` (a quantity needs HVPs)."""
        return self._tracker.planner.plan(step)[1].loss_graph

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
        self._router.request(requests, where=f"cp.prepare({step}, ...)")
        self._tracker.planner.prepare(step)

    def add(self, quantity: QuantitySpec) -> Quantity:
        """Track one more quantity from the next step on.

        ``quantity`` is what an entry of the constructor's ``quantities`` list may be,
        except a preset: a name (``"grad_norm"``), an option dict (``{"name":
        "hess_max_ev", "every": 10}``), a Quantity class or instance, validated the same
        way. Call it between steps, before the forward pass of the next step, so that the
        statistics providers observe that pass; under ``torch.distributed`` call it on
        every process. A quantity whose ``info`` the steps cannot give never stops
        training: it fails at each step it would run through ``on_error`` (an error in
        :attr:`errors` and the log saying what to pass; only ``on_error="raise"`` raises);
        with ``info=`` its keys are checked when the next step begins. :meth:`remove`
        stops tracking a quantity. The log gets a ``quantity_added`` record and the header
        (of :meth:`header`, :meth:`write`, ``read_run``) lists the quantity with
        ``added_at``, the first step it applies to (``docs/log_format.md``).

        Returns:
            The resolved quantity; its values appear under its ``key``.

        Raises:
            ConfigError: Unknown name (with the closest installed one), bad options, a
                preset, or an output key that a tracked quantity already writes (or the
                reserved key ``"metrics"``); nothing is added.
            MisuseError: Called inside a ``with cp(step, ...)`` block.

        """
        tracker = self._tracker
        if tracker.in_step:
            raise MisuseError(
                f"cp.add(...) called inside the `with cp({tracker.active_step}, ...)` block: add "
                "quantities between steps (after the block, before the next forward pass); "
                "they are tracked from the next step on."
            )
        q = resolve_added_quantity(quantity, self.quantities, self.registry)
        # asks for its requirements before anything changes
        warn_unprovided_kinds([q], self._router.providers.values())
        model = self._router.model
        if model is None:
            warn_forward_pass_without_model([q])
        step = tracker.add(q)  # appends to self.quantities
        if self._math_attention and self._attention_hooks is None and model is not None:
            self._install_attention_hooks(model)
        tracker.emit({"kind": "quantity_added", "step": step, "quantity": quantity_entry(q)})
        return q

    def remove(self, quantity: str) -> Quantity:
        """Stop tracking a quantity from the next step on.

        Call it between steps, like :meth:`add`. The quantity's pending two-step start and
        its cached values are dropped, the statistics providers are armed anew for the
        remaining quantities, the log gets a ``quantity_removed`` record, and the header
        (of :meth:`header`, :meth:`write`, ``read_run``) keeps listing it, with
        ``removed_at``, the first step it no longer applies to (``docs/log_format.md``).
        A removed key may be added again with :meth:`add` (it then starts afresh).

        Args:
            quantity: The output key of a tracked quantity (its ``label``, else its name).

        Returns:
            The removed quantity.

        Raises:
            MisuseError: Called inside a ``with cp(step, ...)`` block, or no tracked
                quantity has that key (the message lists the tracked keys).

        """
        tracker = self._tracker
        if tracker.in_step:
            raise MisuseError(
                f"cp.remove({quantity!r}) called inside the `with cp({tracker.active_step}, "
                "...)` block: remove quantities between steps (after the block); they stop "
                "from the next step on."
            )
        keys = [q.key for q in self.quantities]
        if quantity not in keys:
            raise MisuseError(
                f"cp.remove({quantity!r}): no tracked quantity has that key; tracked: "
                f"{', '.join(keys) or '(none)'}."
            )
        q, step = tracker.remove(quantity)
        if self._attention_hooks is not None and tracker.all_hvp_disabled():
            self._attention_hooks.remove()  # no quantity left that needs the math kernel
            self._attention_hooks = None
        tracker.emit({"kind": "quantity_removed", "step": step, "quantity": quantity_entry(q)})
        return q

    def state_dict(self) -> dict[str, Any]:
        """What a training checkpoint needs of this Cockpit, to resume the run exactly.

        Save it with the model and the optimizer, between steps::

            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "cockpit": cp.state_dict()}, path)

        It holds the last step and the schedule's stride, each quantity's options and what
        it keeps across steps (``distance``'s origin, two-step starts, adapted histogram
        ranges, Lanczos warm starts), the error policy's state, the diagnoses' windows and
        findings (and the triggers of ``on_finding`` schedules), and the log's run number;
        only tensors, numbers, strings and lists and dicts of them, so
        ``torch.load(path, weights_only=True)`` reads it
        (:mod:`cockpit_core.engine.state`, ``docs/quickstart.md``).

        Raises:
            MisuseError: Called inside a ``with cp(step, ...)`` block.

        """
        return save_state(self._tracker, self._log.run if self._log is not None else None)

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> LoadReport:
        """Continue the run :meth:`state_dict` saved, before this Cockpit's first step.

        Build the Cockpit as the saved run was built (the same quantities and options, and
        ``log=`` the same path to continue its log), load the model and the optimizer,
        then this; the next step must come after the saved run's last step. Every quantity
        then continues as if training had not stopped. With a log, a ``resumed`` record
        tells readers that the new run continues the earlier one (``read_run`` gives one
        continuous run).

        Args:
            state: What :meth:`state_dict` returned (possibly through ``torch.save`` and
                ``torch.load(..., weights_only=True)``).
            strict: Refuse a state whose quantities or options differ from those tracked
                now. With ``False`` such quantities start afresh (a tracked quantity the
                state lacks starts as if added at the next step) and the rest continues.

        Returns:
            A :class:`~cockpit_core.engine.state.LoadReport` of what did not continue (empty when
            ``strict``).

        Raises:
            MisuseError: A step was tracked already, or inside a step block.
            StateError: Not a Cockpit state, a newer layout, or (``strict``) quantities or
                options that differ (the message lists them).

        """
        tracker = self._tracker
        context = ResumeContext(
            state.get("step") if isinstance(state, Mapping) else None,
            self.params,
            self.param_names,
            self._optimizer,
        )
        report = load_state(tracker, state, context, strict)
        if tracker.last_step is not None:
            tracker.emit(
                {"kind": "resumed", "step": tracker.last_step, "from_run": state.get("log_run")}
            )
        return report

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
        tracker = self._tracker
        if tracker.in_step and step != tracker.active_step:
            raise MisuseError(
                f"cp.log({step}, ...) called inside the `with cp({tracker.active_step}, ...)` "
                f"block: log metrics of step {step} outside that block, or pass step "
                f"{tracker.active_step}."
            )
        if not measured:
            return
        if self.keep_in_memory:
            row = tracker.output.setdefault(step, {})
            row[METRICS_KEY] = {**row.get(METRICS_KEY, {}), **measured}
        tracker.emit({"kind": "metrics", "step": step, "metrics": dict(measured)})

    def attach(
        self,
        model: torch.nn.Module,
        loss_fn: str | Callable[..., torch.Tensor] | torch.nn.Module | None = None,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        math_attention: bool = True,
    ) -> Cockpit:
        """Register the model (and the loss, the optimizer): statistics for any model.

        Knowing the model, cockpit routes each parameter to the cheapest provider that
        supports its module: module hooks (``cockpit-hooks``: linear layers with any
        leading dimensions, embeddings, normalization layers, convolutions, attention),
        BackPACK, and ``torch.func`` for everything else. ``cp.check(model)`` shows the
        routes. See ``docs/any_model.md``. Cockpit also observes the model's forward
        passes (the batch size, the inputs and targets and, with ``loss_fn``, the
        per-sample losses of each step), so that a loop needs only ``with cp(step,
        loss=loss): loss.backward()`` (``docs/quickstart.md``).

        Args:
            model: The module whose forward pass produced the loss; it must own every
                tracked parameter.
            loss_fn: The loss, as for the constructor's ``loss_fn``: a loss module the loop
                calls, a name of :data:`cockpit_core.engine.losses.PER_SAMPLE_LOSSES`, or
                ``loss_fn(outputs, targets)`` on a batch returning the per-sample losses
                ``[B]`` (for ``torch.func`` it may also return their mean: a mean-reduced
                loss evaluated on one sample is that sample's loss). Without targets it
                is called as ``loss_fn(outputs)``. ``None`` forgets an earlier loss.
            optimizer: The training optimizer (``None``: keep the one given before).
            math_attention: While a tracked quantity needs Hessian-vector products, run
                the model's ``scaled_dot_product_attention`` in the math kernel (fused
                kernels have no double backward).

        Returns:
            The Cockpit itself.

        Raises:
            MisuseError: ``model`` is not a module, does not own every tracked parameter,
                ``loss_fn`` is neither a known name nor callable, or ``optimizer`` is not
                an optimizer.

        """
        if not isinstance(model, torch.nn.Module):
            raise MisuseError(
                f"cp.attach(model, loss_fn) needs a torch.nn.Module, got {type(model).__name__}."
            )
        model = uncompiled(model)
        spec = _resolve_loss(loss_fn, "cp.attach(model, loss_fn)")
        if optimizer is not None:
            self._optimizer = _checked_optimizer(optimizer)
        tracker = self._tracker
        self._router.attach(model, spec.for_func if spec is not None else None)
        if tracker.observer is not None:
            tracker.observer.attach(model, spec)
        self._loss_fn = loss_fn
        last = tracker.last_step
        tracker.planner.prepare(last + 1 if last is not None else 0)
        if self._attention_hooks is not None:
            self._attention_hooks.remove()
            self._attention_hooks = None
        self._math_attention = math_attention
        if math_attention:
            self._install_attention_hooks(model)
        return self

    def _install_attention_hooks(self, model: torch.nn.Module) -> None:
        """Run ``model``'s attention in the math kernel while a quantity needs HVPs.

        The forward passes and, for ``torch.utils.checkpoint``'s recomputation, their
        backward passes (:class:`~cockpit_core.engine.attention.MathAttentionHooks`). Nothing is
        installed if no tracked quantity needs Hessian-vector products.
        """
        tracker = self._tracker

        def uses_hvp(q: Quantity) -> bool:
            try:
                return tracker.uses_hvp(q)
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException:  # plugin code: the planner reports it at the first step
                return False

        if any(uses_hvp(q) for q in self.quantities):
            self._attention_hooks = MathAttentionHooks(
                model, lambda: not tracker.all_hvp_disabled()
            )

    def check(
        self,
        model: torch.nn.Module,
        sample: Sample | None = None,
        *,
        loss: str | Callable[..., torch.Tensor] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> CoverageReport:
        """Report, per quantity, whether it can be computed for ``model``, how, and why not.

        ``print(cp.check(model))`` before training shows, per quantity, which providers
        compute its statistics and, per parameter, why cheaper providers cannot (e.g. no
        rule for its module), so no step is wasted on quantities that cannot run. If no
        model was attached, ``model`` is attached (:meth:`attach` without a loss).
        Per-sample quantities are unavailable while a tracked BatchNorm layer is in
        training mode (per-sample gradients are not defined there).

        Without ``sample`` no forward pass runs: the report comes from what the providers
        say of each module. With one, cockpit also runs one tracked step of this Cockpit's
        quantities on a deep copy of ``model``, through a throwaway Cockpit with the same
        providers and options and no log or sinks; the model, its gradients, ``optimizer``
        and the random state are left as they were. The report then says what each
        quantity did (a value, or its error) and, per parameter, which provider delivered
        its statistics, or why none did and what to change; ``report.ok`` is ``False`` if
        a quantity failed or a statistic is missing. See ``docs/any_model.md``.

        Args:
            model: The model (it must own every tracked parameter).
            sample: ``sample(model) -> loss``: a callable that runs the model and returns
                the mean loss, or the per-sample losses ``[B]`` (then quantities that need
                ``info["individual_losses"]`` run too); or a batch ``(inputs, targets)``,
                or ``inputs`` alone (random targets for a named loss), where ``inputs`` is
                a tensor, a tuple (positional arguments) or a dict (keyword arguments).
            loss: The loss of a batch: ``"cross_entropy"`` (class scores on the last
                dimension of ``[B, C]`` or ``[B, T, C]``; per sample the mean over tokens),
                ``"mse"``, the loss module of training (``nn.CrossEntropyLoss()`` or
                ``nn.MSELoss()``, BackPACK-extended or not), or a callable ``loss(outputs,
                targets)`` returning the per-sample losses ``[B]`` or their mean. Default:
                the loss of :meth:`attach`.
            optimizer: The training optimizer; a copy on the copied parameters serves
                quantities that read ``info["optimizer"]`` (without it they do not run).

        Raises:
            MisuseError: Called inside a step, or a sample or loss that is not one of the
                forms above.

        """
        router = self._router
        model = uncompiled(model)
        spec = None
        if sample is not None:
            if self._tracker.in_step:
                raise MisuseError(
                    "cp.check(model, sample=...) called inside a `with cp(step, ...)` block: "
                    "check the model before training or between steps."
                )
            spec = sample_spec(sample, loss, router.loss_fn, self.registry.prepare_module)
        if router.model is not model:  # routing needs it; arm its providers too
            self.attach(model, self._loss_fn if router.model is None else None)
        report = check_model(self.quantities, model, router, self._math_attention)
        report = refuse_batch_norm(report, model, self.quantities, self.params)
        if spec is None:
            return report
        observer = self._tracker.observer
        with observer.paused() if observer is not None else contextlib.nullcontext():
            step, params = run_sample_step(
                model,
                spec,
                self.param_names,
                self.params,
                self.quantities,
                router,
                self._probe,
                optimizer,
                self._math_attention,
            )
        return dataclasses.replace(report, sample=step, params=params or report.params)

    def _probe(
        self, params: list[tuple[str, torch.nn.Parameter]], quantities: list[Quantity]
    ) -> Cockpit:
        """A Cockpit like this one for ``params`` (copies), without log, sinks or diagnoses."""
        return Cockpit(
            params,
            quantities,
            on_error="warn",
            registry=self.registry,
            distributed="off",
            **self._provider_settings,
        )

    @property
    def errors(self) -> list[Record]:
        """Failures of quantities: step, quantity, phase, message, traceback summary."""
        return self._tracker.policy.errors

    @property
    def skipped(self) -> list[Record]:
        """Steps whose quantities did not run, and why.

        A non-finite loss or gradient (also a ``GradScaler``'s overflow), or no
        ``backward()`` inside the block.
        """
        return self._tracker.policy.skipped

    def get_output(self) -> dict[int, dict[str, Any]]:
        """All values tracked so far as ``{step: {quantity_key: value}}``.

        Metrics logged with :meth:`log` are under the reserved key ``"metrics"``:
        ``{step: {..., "metrics": {name: value}}}``.
        """
        return {s: dict(v) for s, v in sorted(self._tracker.output.items())}

    def write(self, path: str | Path) -> Path:
        """Write one consolidated JSON file (header, values, errors); read it with ``read_log``.

        The write is atomic: a temporary file in the same folder is written, flushed,
        fsync-ed and renamed over ``path``, so a process killed meanwhile leaves the
        previous file intact. Any value can be written (see ``docs/log_format.md``).
        """
        payload = {
            "header": self.header(),
            "output": {str(s): v for s, v in self.get_output().items()},
            "errors": self.errors,
            "skipped": self.skipped,
        }
        if self._tracker.findings:  # from diagnoses=[...]; the key only when there are some
            payload["findings"] = [
                {k: v for k, v in f.to_record().items() if k != "kind"}
                for f in self._tracker.findings
            ]
        return write_json_atomic(path, payload)

    def close(self) -> None:
        """Flush and close the log and every sink that has a ``close()`` method."""
        if self._attention_hooks is not None:  # a kernel a failed backward pass still holds
            self._attention_hooks.release()
        self._tracker.close()

    @property
    def debug(self) -> bool:
        """Print what is computed at each step (may be switched at any time)."""
        return self._tracker.debug

    @debug.setter
    def debug(self, value: bool) -> None:
        self._tracker.debug = bool(value)

    @property
    def sinks(self) -> list[Sink]:
        """Where every record goes: the log (if any), then the other sinks, in order."""
        return self._tracker.sinks

    @property
    def findings(self) -> list[Finding]:
        """What the ``diagnoses`` found while training so far, each finding once."""
        return list(self._tracker.findings)

    def plot(self, path: str | Path | None = None, **options: Any) -> Any:
        """Render the dashboard of what was tracked so far into ``path``.

        The renderer registered for ``path``'s suffix draws it (``register_renderers``;
        cockpit-dashboard: ``.png``, ``.svg``, ``.pdf``, cockpit-web: ``.html``). Returns
        ``path`` when given; without one, what the ``.png`` renderer drew (the dashboard's
        matplotlib figure). ``options`` go to the renderer (the dashboard's: ``title``,
        ``rows``, ``dpi``, ...).

        Raises:
            UnknownRendererError: No installed plugin renders that suffix.

        """
        return self.registry.renderer(path).render(self, path, **options)


# -- checks of the training objects ---------------------------------------------------------


def _resolve_loss(loss_fn: Any, where: str) -> LossSpec | None:
    """``loss_fn`` resolved (:func:`~cockpit_core.observe.loss_spec`).

    Raises:
        MisuseError: An unknown name, or neither a name nor a callable.

    """
    try:
        return loss_spec(loss_fn)
    except (ValueError, TypeError) as err:
        raise MisuseError(f"{where}: {err}.") from None


def _checked_optimizer(optimizer: Any) -> Any:
    """``optimizer`` if it is one (has ``param_groups``) or ``None``.

    Raises:
        MisuseError: Something else.

    """
    if optimizer is not None and not hasattr(optimizer, "param_groups"):
        raise MisuseError(
            f"optimizer= must be the training optimizer (a torch.optim.Optimizer), got "
            f"{type(optimizer).__name__}."
        )
    return optimizer
