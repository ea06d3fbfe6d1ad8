"""Checks every dashboard instrument (panel) must pass: :func:`check_instrument`.

Run them in your plugin's tests::

    from cockpit_core.testing import check_instrument

    def test_my_panel_draws():
        check_instrument(MY_INSTRUMENT, quantities=[MyQuantity])
"""

from __future__ import annotations

import io
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.instrument import Instrument
from cockpit_core.log import LogData, read_run
from cockpit_core.panel.planning import Panel, load, panel_output, plan
from cockpit_core.plugin.registry import Registry, default_registry
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.problems import Problem, tiny_mlp
from cockpit_core.testing.runner import run_cockpit

SAMPLE_METRICS: dict[str, float] = {
    "train_loss": 2.1,
    "valid_loss": 2.3,
    "test_loss": 2.4,
    "train_accuracy": 0.31,
    "valid_accuracy": 0.27,
    "test_accuracy": 0.25,
    "learning_rate": 0.1,
}
"""Metrics :func:`check_instrument` logs with ``cp.log`` when a panel reads ``metrics``."""


def check_instrument(
    instrument: Instrument | Callable[[], Instrument],
    quantities: Iterable[Any] | None = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    output: Mapping[int, Mapping[str, Any]] | None = None,
    header: Mapping[str, Any] | None = None,
    problem: Problem | None = None,
    steps: int = 6,
    registry: Registry | None = None,
) -> Any:
    """Draw ``instrument`` on sample output; raise :class:`ConformanceError` if it fails.

    The sample output comes from a short :func:`run_cockpit` run that tracks the quantities
    the instrument reads (``quantities`` and ``optional``; the ``metrics`` of ``cp.log`` are
    logged with :data:`SAMPLE_METRICS`), or is the synthetic ``output`` you give. The panel
    must be planned (its quantities tracked for ``min_steps`` steps, ``available`` true),
    and ``draw`` must run and the figure render to PNG without an exception or a warning
    (warnings are errors here), on the output in memory and as read back from the log.

    Args:
        instrument: The :class:`~cockpit_core.instrument.Instrument`, or a function (or
            class) that returns one when called without arguments.
        quantities: What the sample run tracks: names, dicts, classes or instances as
            ``Cockpit`` takes them (default: the instrument's quantities by name, from
            ``registry``). Give your quantity classes when the plugin is not installed.
        options: Options per quantity name for the default ``quantities``, e.g.
            ``{"grad_hist_1d": {"keep_individual": True}}``.
        output: Synthetic ``{step: {quantity_name: value}}`` to draw instead of a run.
        header: The log header that goes with ``output`` (default ``{}``).
        problem: The problem to train (default: :func:`tiny_mlp`).
        steps: Steps to train.
        registry: Where quantities named by the instrument come from (default: every
            installed plugin).

    Returns:
        The matplotlib ``Figure`` of the last drawing, for further assertions.

    Raises:
        ConformanceError: What failed (building the instrument, the sample run, the plan,
            ``available``, ``draw`` or rendering), with the original error chained.

    """
    inst = _resolve(instrument)
    if output is not None:
        data = LogData(dict(header or {}), {int(k): dict(v) for k, v in output.items()}, [])
        return _check_drawing(inst, [("on the given output", data)])
    with tempfile.TemporaryDirectory(prefix="cockpit-check-instrument-") as tmp:
        variants = _sample_run(inst, quantities, options, problem, steps, registry, Path(tmp))
        return _check_drawing(inst, variants)


def _resolve(instrument: Any) -> Instrument:
    """The instrument itself, or what calling ``instrument()`` returns."""
    if isinstance(instrument, Instrument):
        return instrument
    if not callable(instrument):
        raise ConformanceError(
            f"check_instrument needs an Instrument or a function returning one, got "
            f"{type(instrument).__name__}."
        )
    try:
        made = instrument()
    except TypeError as err:
        raise ConformanceError(f"building the instrument failed: {err}") from err
    if not isinstance(made, Instrument):
        raise ConformanceError(
            f"{getattr(instrument, '__name__', instrument)!r}() returned "
            f"{type(made).__name__}, not a cockpit_core.instrument.Instrument."
        )
    return made


def _sample_run(
    inst: Instrument,
    quantities: Iterable[Any] | None,
    options: Mapping[str, Mapping[str, Any]] | None,
    problem: Problem | None,
    steps: int,
    registry: Registry | None,
    tmp: Path,
) -> list[tuple[str, LogData]]:
    """Track what ``inst`` reads for ``steps`` steps; the output in memory and from the log."""
    names = [q for q in inst.all_quantities if q != METRICS_KEY]
    if quantities is None:
        registry = registry or default_registry()
        unknown = [q for q in names if not registry.is_known(q)]
        if unknown:
            raise ConformanceError(
                f"instrument '{inst.name}' reads {', '.join(repr(q) for q in unknown)}, which "
                "no plugin of the registry provides: pass quantities=[YourQuantity, ...] "
                "(classes work without installing the plugin) or output={step: {name: value}}."
            )
        specs: list[Any] = [{"name": q, **dict((options or {}).get(q, {}))} for q in names]
    else:
        specs = list(quantities)
    path = tmp / "log.jsonl"
    try:
        result = run_cockpit(
            problem or tiny_mlp(), specs, steps=steps, registry=registry, log=path, on_error="raise"
        )
        if METRICS_KEY in inst.all_quantities:
            for step in range(steps):
                result.cockpit.log(step, epoch_count=step // 2, **_metrics_at(step))
        memory = load(result.cockpit)
        result.cockpit.close()
    except ConformanceError:
        raise
    except Exception as err:
        raise ConformanceError(
            f"could not build sample output for instrument '{inst.name}': tracking {specs} "
            f"failed with {type(err).__name__}: {err}"
        ) from err
    return [
        ("on the output in memory", memory),
        ("on the output read back from the log", read_run(path)),
    ]


def _metrics_at(step: int) -> dict[str, float]:
    """:data:`SAMPLE_METRICS`, losses falling and accuracies rising with ``step``."""
    return {
        name: value * (0.9**step if name.endswith("loss") else 1 + 0.05 * step)
        for name, value in SAMPLE_METRICS.items()
    }


def _first_steps(inst: Instrument, data: LogData) -> LogData:
    """``data`` up to the first step at which the dashboard would draw ``inst`` (live plots)."""
    kept: dict[int, dict[str, Any]] = {}
    counts = dict.fromkeys(inst.quantities, 0)
    for step in sorted(data.output):
        values = data.output[step]
        kept[step] = dict(values)
        for q in counts:
            counts[q] += values.get(q) is not None
        if counts and min(counts.values()) >= inst.min_steps:
            break
        if not counts and any(values.get(q) is not None for q in inst.optional):
            break
    return LogData(data.header, kept, [])


def _check_drawing(inst: Instrument, variants: list[tuple[str, LogData]]) -> Any:

    first = variants[0][1]
    variants = [
        *variants,
        ("on the first steps only (as a live plot draws it)", _first_steps(inst, first)),
    ]
    fig = None
    for where, data in variants:
        for panel in _panels(inst, data, where):
            fig = _draw(inst, panel, data, where)
    return fig


def _draw(inst: Instrument, panel: Panel, data: LogData, where: str) -> Any:
    """Draw ``panel`` on a fresh figure and render it, warnings raised as errors."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6, 2.7), dpi=50)
    ax = fig.add_subplot()
    ax.set_title(panel.title, fontsize=9.5, fontweight="bold", loc="left")
    out = panel_output(data, panel)
    stage = "draw(ax, output, header)"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error")
            inst.draw(ax, out, data.header)
            stage = "rendering the drawn panel"
            fig.savefig(io.BytesIO(), format="png")
    except Exception as err:
        raise ConformanceError(
            f"instrument '{inst.name}' failed {where}: {stage} raised "
            f"{type(err).__name__}: {err} (steps {sorted(out)}, "
            f"quantities {sorted({k for v in out.values() for k in v})}; "
            "warnings count as failures)."
        ) from err
    return fig


def _panels(inst: Instrument, data: LogData, where: str) -> list[Panel]:
    """The panels the dashboard draws for ``inst``; a clear error when it draws none."""
    plan_ = plan(data, [inst])
    if plan_.panels:
        return plan_.panels
    for skipped, missing in plan_.skipped:
        raise ConformanceError(
            f"instrument '{inst.name}' is not drawn {where}: it needs "
            f"{', '.join(missing)} with at least {skipped.min_steps} step(s) of values; "
            f"the output has {sorted({k for v in data.output.values() for k in v}) or 'none'}."
        )
    probe = Panel(inst, {q: q for q in inst.all_quantities}, inst.title)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error")
            verdict = inst.available(panel_output(data, probe))  # type: ignore[misc]
    except Exception as err:
        raise ConformanceError(
            f"instrument '{inst.name}': available(output) raised {type(err).__name__}: {err} "
            f"{where}."
        ) from err
    raise ConformanceError(
        f"instrument '{inst.name}' is not drawn {where}: available(output) returned "
        f"{verdict!r}. Give check_instrument output the panel is meant for (options=... or "
        f"output=...); its description says: {inst.description or '(none)'}."
    )
