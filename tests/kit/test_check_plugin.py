"""check_plugin: everything a distribution registers, checked; every problem reported at once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cockpit_core.testing import ConformanceError, check_plugin

GOOD = """
from pydantic import Field

from cockpit_core import Quantity, QuantityConfig, hookimpl
from cockpit_core.panel import Instrument, series

RECORDS = []


class SumConfig(QuantityConfig):
    scale: float = Field(1.0, description="Factor of the value.")


class ParamSum(Quantity):
    name = "fakeplug_param_sum"
    Config = SumConfig

    def compute(self, ctx):
        return self.config.scale * sum(float(p.detach().double().sum()) for p in ctx.params)


def draw(ax, output, header):
    steps, values = series(output, "fakeplug_param_sum")
    ax.plot(steps, values)


class ListSink:
    def __init__(self, prefix="run"):
        self.prefix = prefix

    def __call__(self, record):
        RECORDS.append((self.prefix, record["kind"]))

    def close(self):
        RECORDS.append((self.prefix, "closed"))


@hookimpl
def register_quantities(register):
    register(ParamSum)


@hookimpl
def register_presets(register):
    register("fakeplug_preset", ["fakeplug_param_sum", {"name": "loss", "every": 2}])


@hookimpl
def register_instruments(register):
    register(Instrument(name="fakeplug_panel", title="Sum", topic="gradient",
                        quantities=("fakeplug_param_sum",), draw=draw))


@hookimpl
def register_sinks(register):
    register("fakeplug_sink", ListSink, description="Collects record kinds.")
"""

BROKEN = """
from pydantic import Field

from cockpit_core import Quantity, QuantityConfig, hookimpl
from cockpit_core.panel import Instrument


class NoDescriptionConfig(QuantityConfig):
    bins: int = 3


class Undescribed(Quantity):
    name = "fakeplug_undescribed"
    Config = NoDescriptionConfig

    def compute(self, ctx):
        return 1.0


class Clash(Quantity):
    name = "grad_norm"  # cockpit-basic's

    def compute(self, ctx):
        return 1.0


def draw(ax, output, header):
    ax.plot([0], [1])


def failing_sink():
    def sink(record):
        if record["kind"] == "values":
            raise ValueError("cannot take values")
    return sink


@hookimpl
def register_quantities(register):
    register(Undescribed)
    register(Clash)


@hookimpl
def register_presets(register):
    register("fakeplug_bad_preset", ["fakeplug_undescribed", "fakeplug_not_installed"])


@hookimpl
def register_instruments(register):
    register(Instrument(name="fakeplug_orphan", title="Orphan", topic="gradient",
                        quantities=("fakeplug_nobody_provides",), draw=draw))


@hookimpl
def register_sinks(register):
    register("fakeplug_failing", failing_sink)
"""


def test_a_good_plugin_passes_every_check(fake_distribution):
    fake_distribution("fakeplug-good", "fakeplug_good", GOOD, version="2.1")
    report = check_plugin("fakeplug_good")
    assert (report.name, report.distribution, report.version) == (
        "fakeplug_good",
        "fakeplug-good",
        "2.1",
    )
    assert report.checked == [
        "quantity fakeplug_param_sum",
        "preset fakeplug_preset",
        "instrument fakeplug_panel",
        "sink fakeplug_sink",
    ]
    assert report.not_checked == []
    import fakeplug_good

    # the sink got the records of a 3-step run of the plugin's quantity, then close()
    kinds = [kind for prefix, kind in fakeplug_good.RECORDS if prefix == "run"]
    assert kinds[0] == "header" and kinds[-1] == "closed"
    assert kinds.count("values") == 3 and "metrics" in kinds


def test_arguments_reach_the_checks_and_skip_leaves_things_out(fake_distribution):
    fake_distribution("fakeplug-good", "fakeplug_good", GOOD)
    report = check_plugin(
        "fakeplug_good",
        arguments={
            "fakeplug_param_sum": {"options": {"scale": 2.0}},
            "fakeplug_sink": {"prefix": "x"},
        },
        skip=("fakeplug_panel",),
    )
    assert "instrument fakeplug_panel" not in report.checked
    assert report.not_checked == ["instrument fakeplug_panel: in skip"]
    import fakeplug_good

    assert ("x", "closed") in fakeplug_good.RECORDS


def test_a_broken_plugin_reports_every_problem_at_once(fake_distribution):
    fake_distribution("fakeplug-broken", "fakeplug_broken", BROKEN)
    with pytest.raises(ConformanceError) as err:
        check_plugin("fakeplug_broken")
    message = str(err.value)
    assert message.startswith("plugin 'fakeplug_broken' (fakeplug-broken 1.0) has 5 problems:")
    problems = message.split("\n  - ")[1:]
    assert len(problems) == 5
    assert "name collision: The name 'grad_norm' is registered by both" in problems[0]
    assert "quantity 'fakeplug_undescribed': " in problems[1] and "no description" in problems[1]
    assert "preset 'fakeplug_bad_preset': does not resolve" in problems[2]
    assert "fakeplug_not_installed" in problems[2]
    assert "instrument 'fakeplug_orphan': " in problems[3]
    assert "'fakeplug_nobody_provides'" in problems[3]
    assert (
        "sink 'fakeplug_failing': raised ValueError: cannot take values on a 'values' record"
        in problems[4]
    )


def test_a_plugin_that_does_not_load_or_is_not_installed(fake_distribution):
    fake_distribution("fakeplug-noimport", "fakeplug_noimport", "raise ImportError('no numpy 9')")
    with pytest.raises(ConformanceError, match="failed to load: import failed: ImportError"):
        check_plugin("fakeplug_noimport")
    with pytest.raises(ConformanceError, match="no cockpit plugin is named 'fakeplug_missing'"):
        check_plugin("fakeplug_missing")


def test_a_module_is_checked_without_installing_it():
    path = Path(__file__).parents[1] / "providers" / "l1_kind.py"
    spec = importlib.util.spec_from_file_location("fakeplug_l1_kind", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = check_plugin(module)
    # the kind's from_per_sample, run by the func provider, against loop gradients
    assert report.checked == ["statistic kind batch_l1"]
    assert report.distribution == "<local>"
