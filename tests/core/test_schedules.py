import pytest

from cockpit_core import EveryN, ExplicitSteps, Logarithmic
from cockpit_core.errors import ConfigError
from cockpit_core.quantity import QuantityConfig, validate_config


def test_every_n_with_offset():
    sched = EveryN(every=3, offset=2)
    assert [s for s in range(12) if sched(s)] == [2, 5, 8, 11]


def test_logarithmic_is_sorted_unique_and_inclusive():
    sched = Logarithmic(start=1, end=1000, num=4)
    assert sorted(sched.steps) == [1, 10, 100, 1000]
    assert Logarithmic(start=0, end=10, num=3)(0)


def test_logarithmic_rejects_end_before_start():
    with pytest.raises(ConfigError, match="end .* must not be smaller than start"):
        validate_config(Logarithmic, {"start": 10, "end": 5})


def test_explicit_steps():
    sched = ExplicitSteps(steps=[0, 7])
    assert [s for s in range(10) if sched(s)] == [0, 7]


def test_config_schedule_as_data_and_shorthand():
    cfg = validate_config(QuantityConfig, {"schedule": {"kind": "steps", "steps": [4]}})
    assert cfg.resolved_schedule()(4) and not cfg.resolved_schedule()(5)
    cfg = validate_config(QuantityConfig, {"every": 5, "offset": 1})
    assert cfg.resolved_schedule()(6) and not cfg.resolved_schedule()(5)
    assert validate_config(QuantityConfig, {}).resolved_schedule()(123)


def test_config_rejects_both_schedule_forms():
    with pytest.raises(ConfigError, match="either 'schedule' or 'every'"):
        validate_config(QuantityConfig, {"every": 2, "schedule": {"kind": "every", "every": 3}})


def test_unknown_schedule_kind_names_the_field():
    with pytest.raises(ConfigError) as err:
        validate_config(QuantityConfig, {"schedule": {"kind": "sometimes"}}, prefix="quantities.0")
    assert "quantities.0.schedule" in str(err.value)
