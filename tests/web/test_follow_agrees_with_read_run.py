"""Property: the web view's follower and ``read_run`` agree on every step and value.

Random logs of valid JSON records (well-formed steps, metrics, findings, errors, resumed
runs, and headers of random shapes) are written; the follower, reading them in random
pieces, must never raise and must show exactly the scalar series of ``read_run`` over the
records it accepted (``read_run`` itself accepts the log exactly when the follower
skipped nothing).
"""

from __future__ import annotations

import json

from cockpit_web import Feed, render_page
from cockpit_web.follow import LogFollower, reduced, scalar_series
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cockpit_core.log import LogFormatError, read_run

KEYS = ["loss", "grad_norm", "alpha", "time"]
steps = st.integers(0, 4)  # few steps: runs re-record them often
numbers = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.booleans(),
)
anything = st.recursive(
    st.one_of(st.none(), numbers, st.text(max_size=3)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), inner)
    ),
    max_leaves=6,
)
value = st.one_of(
    numbers,
    st.fixed_dictionaries({"total": numbers}, optional={"per_param": anything}),
    anything,
)
shapes = st.one_of(st.none(), anything, st.just([{"name": "time", "key": "time"}]))

records = st.one_of(
    st.builds(
        lambda s, v: {"kind": "values", "step": s, "values": v},
        steps,
        st.dictionaries(st.sampled_from(KEYS), value, max_size=3),
    ),
    st.builds(
        lambda s, m: {"kind": "metrics", "step": s, "metrics": m},
        steps,
        st.dictionaries(st.sampled_from(["acc", "lr"]), numbers, max_size=2),
    ),
    st.builds(lambda q, p: {"kind": "header", "quantities": q, "params": p}, shapes, shapes),
    st.builds(lambda s: {"kind": "resumed", "step": s, "from_run": 1}, steps),
    st.builds(lambda s: {"kind": "error", "step": s, "quantity": "loss", "error": "E"}, steps),
    st.builds(
        lambda i, first, severity: {
            "kind": "finding",
            "id": f"d@{i}",
            "diagnosis": "d",
            "severity": severity,
            "first_step": first,
            "last_step": 3,
            "message": "m",
            "evidence": {},
        },
        st.integers(0, 2),
        st.one_of(steps, st.just("a")),
        st.sampled_from(["info", "warning", "error", 3]),
    ),
    st.builds(
        lambda s: {"kind": "values", "step": s, "values": {"loss": 1.0}}, st.text(max_size=2)
    ),
)


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    log=st.lists(records, max_size=25),
    cuts=st.lists(st.floats(0, 1), max_size=8),  # where the log is when polled
    one_run=st.booleans(),
)
def test_follower_agrees_with_read_run(tmp_path_factory, log, cuts, one_run):
    if one_run:  # the follower's incremental path: one header first, no resumed run
        log = [{"kind": "header", "quantities": [{"name": "time", "key": "time"}]}] + [
            r for r in log if r["kind"] not in ("header", "resumed")
        ]
    folder = tmp_path_factory.mktemp("prop")
    path = folder / "log.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in log).encode()
    follower = LogFollower(path, "run")
    written = 0
    for cut in sorted(int(c * len(text)) for c in cuts):  # grows in random pieces
        with open(path, "ab") as f:
            f.write(text[written:cut])
        written = cut
        follower.poll()
    with open(path, "ab") as f:
        f.write(text[written:])
    follower.poll()
    skipped: list[str] = []
    if not text:
        assert follower.series == {} and follower.skipped == 0
        return
    data = read_run(path, skipped=skipped)
    assert follower.records == len(log) - len(skipped)
    assert follower.series == scalar_series(data)
    assert follower.data.output == {
        step: {k: reduced(v) for k, v in row.items()} for step, row in data.output.items()
    }
    assert list(follower.findings.values()) == data.findings
    try:
        strict = read_run(path)
    except LogFormatError:
        assert skipped
    else:
        assert not skipped and scalar_series(strict) == follower.series
    if follower.skipped:
        assert "skipped" in follower.error
    payload = Feed([path], diagnose=False).payload()  # never raises, whatever the shapes
    assert render_page(payload)


def _grow(path, records) -> LogFollower:
    """A follower polled after each record is appended."""
    follower = LogFollower(path, "run")
    path.write_text("")
    for record in records:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
        follower.poll()
    return follower


def test_a_step_recorded_again_in_a_later_poll_drops_its_old_tags(tmp_path):
    path = tmp_path / "log.jsonl"
    follower = _grow(
        path,
        [
            {"kind": "header"},
            {"kind": "values", "step": 1, "values": {"g": {"total": 1.0}, "loss": 2.0}},
            {"kind": "values", "step": 1, "values": {"g": 3.0}},
        ],
    )
    assert follower.series == scalar_series(read_run(path)) == {"g": {1: 3.0}, "loss": {1: 2.0}}


def test_time_counts_from_its_first_step_whatever_the_order_of_arrival(tmp_path):
    path = tmp_path / "log.jsonl"
    header = {"kind": "header", "quantities": [{"name": "time", "key": "time"}]}
    follower = _grow(
        path,
        [header]
        + [{"kind": "values", "step": s, "values": {"time": 100.0 + s}} for s in (5, 2, 7)],
    )
    assert follower.series == scalar_series(read_run(path))
    assert follower.series["time"] == {2: 0.0, 5: 3.0, 7: 5.0}


def test_a_second_run_appearing_later_is_folded_as_read_run_does(tmp_path):
    path = tmp_path / "log.jsonl"
    run = [{"kind": "values", "step": s, "values": {"loss": float(s), "x": 1.0}} for s in range(3)]
    follower = _grow(
        path,
        [{"kind": "header", "run": 1}, *run, {"kind": "header", "run": 2}]
        + [{"kind": "values", "step": 1, "values": {"loss": 9.0}}],
    )
    assert follower.series == scalar_series(read_run(path))
    assert follower.series["x"] == {0: 1.0, 2: 1.0}  # run 2's step 1 replaced run 1's
