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


def test_a_huge_logarithmic_num_is_a_field_error_not_an_allocation():
    with pytest.raises(ConfigError) as err:
        validate_config(
            QuantityConfig,
            {"schedule": {"kind": "log", "end": 1000, "num": 10**9}},
            prefix="quantities.2",
        )
    assert err.value.errors == [
        (
            "quantities.2.schedule.num",
            "num = 1000000000 is too large: a logarithmic schedule tracks at most 100000 "
            "steps; use kind 'every' to track densely",
        )
    ]


def test_the_documented_bounds_of_a_logarithmic_schedule():
    from cockpit_core.schedules import MAX_LOG_STEPS, MAX_STEP

    sched = Logarithmic(start=1, end=MAX_STEP, num=MAX_LOG_STEPS)
    assert sched(1) and sched(MAX_STEP) and len(sched.steps) <= MAX_LOG_STEPS
    with pytest.raises(ConfigError) as err:
        validate_config(Logarithmic, {"end": MAX_STEP + 1})
    assert err.value.errors == [("end", "Input should be less than or equal to 1000000000000000")]


@pytest.mark.parametrize(
    "schedule, path, message",
    [
        ({"kind": "every", "every": True}, "schedule.every", "got bool True"),
        ({"kind": "every", "offset": "3"}, "schedule.offset", "got str '3'"),
        ({"kind": "log", "end": 10.0}, "schedule.end", "got float 10.0"),
        ({"kind": "log", "end": 10, "num": False}, "schedule.num", "got bool False"),
        ({"kind": "steps", "steps": [0, True]}, "schedule.steps.1", "got bool True"),
        ({"kind": "steps", "steps": [-1]}, "schedule.steps.0", "greater than or equal to 0"),
    ],
)
def test_schedule_fields_are_strict(schedule, path, message):
    with pytest.raises(ConfigError) as err:
        validate_config(QuantityConfig, {"schedule": schedule})
    ((got_path, got_message),) = err.value.errors
    assert got_path == path and message in got_message


def test_schedules_from_json_lists_keep_working():
    cfg = validate_config(QuantityConfig, {"schedule": {"kind": "steps", "steps": [3, 1, 3]}})
    assert cfg.schedule.steps == frozenset({1, 3})
    assert validate_config(QuantityConfig, {"every": 4}).resolved_schedule()(8)
