"""Records of the wrong shape, a resumed run, the Host check and serve's arguments (issue 29).

A valid-JSON record of the wrong shape is skipped and counted with a visible warning; the
page, ``data.json``, ``cockpit plot -o x.html`` and the page's own script keep working and
show every later record. A resumed log shows what ``read_run`` shows.
"""

from __future__ import annotations

import http.client
import json
import re
import threading

import pytest
from cockpit_web import Feed, LogFollower, make_server, render_page, write_page
from cockpit_web.follow import scalar_series

from cockpit_core.cli.main import main
from cockpit_core.log import LogFormatError, dumps, read_run

from .conftest import STEPS

BAD_RECORDS = [  # valid JSON, wrong shape: each line is skipped
    {"kind": "finding", "id": "a@1", "diagnosis": "a", "severity": "info", "first_step": "a",
     "last_step": 1, "message": "m", "evidence": {}},
    {"kind": "finding", "id": "b@1", "diagnosis": "b", "severity": 3, "first_step": 1,
     "last_step": 1, "message": "m", "evidence": {}},
    {"kind": "header", "run": 9, "quantities": 5},
    {"kind": "header", "run": 9, "params": "x"},
    {"kind": "values", "step": "7", "values": {"loss": 1.0}},
    {"kind": "metrics", "step": 7, "metrics": [1, 2]},
]  # fmt: skip
BAD_VALUES = [  # records of the right shape whose values the view cannot draw
    {"kind": "values", "step": STEPS, "values": {"grad_hist_1d": {"hist": ["a", "b"],
     "edges": [0.0, 1.0, 2.0]}}},
    {"kind": "values", "step": STEPS, "values": {"grad_norm": {"total": 2.0,
     "per_param": [[1.0, 2.0], [3.0]]}}},
    {"kind": "values", "step": STEPS, "values": {"optimizer_hparams": {"groups": "x"}}},
]  # fmt: skip
LATER = {"kind": "values", "step": 20, "values": {"loss": 0.25}}


@pytest.fixture
def bad_log(logged_run):
    with open(logged_run.log, "a") as f:
        for record in (*BAD_RECORDS, *BAD_VALUES, LATER):
            f.write(json.dumps(record) + "\n")
    return logged_run.log


def test_bad_records_are_skipped_counted_and_later_data_shown(bad_log):
    follower = LogFollower(bad_log, "run")
    assert follower.poll() is True
    assert follower.skipped == len(BAD_RECORDS) + 2  # the ragged per_param, the string counts
    assert follower.error.startswith(f"{follower.skipped} records skipped: line ")
    assert "'step' must be an integer" not in follower.error  # only the first 3 are named
    assert "a 'finding' record needs" in follower.error
    assert follower.series["loss"][20] == 0.25  # later data is not hidden
    assert follower.series["grad_norm/total"][STEPS] == 2.0  # the drawable part of it
    assert follower.findings == {}  # neither bad finding
    assert follower.poll() is False  # it advanced past all of it, once


def test_bad_records_never_break_the_page_data_json_or_plot_html(bad_log, tmp_path, capsys):
    feed = Feed([bad_log])
    payload = feed.payload()
    assert "records skipped" in payload["runs"][0]["error"]
    assert payload["runs"][0]["skipped"] == len(BAD_RECORDS) + 2
    assert "Plotly.react" in render_page(payload)
    with make_server([bad_log], port=0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            port = server.server_address[1]
            for route in ("/", "/data.json"):
                status, body = _get(port, route, f"localhost:{port}")
                assert status == 200, body[:300]
            data = json.loads(body)
            assert "records skipped" in data["runs"][0]["error"]
            assert data["runs"][0]["last_step"] == 20
        finally:
            server.shutdown()
            thread.join(5)
    out = tmp_path / "x.html"
    assert main(["plot", str(bad_log), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"Dashboard written to {out}" in captured.out
    assert re.search(r"warning: run: \d+ records skipped: line \d+", captured.err)
    assert "Traceback" not in captured.err


def test_plot_html_errors_are_messages(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "missing.log"), "-o", str(tmp_path / "x.html")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "neither a cockpit log nor a run folder" in err
    garbage = tmp_path / "g.jsonl"
    garbage.write_text('[1, 2]\n"x"\n{"kind": "values", "step": 1, "values": 3}\n')
    assert main(["plot", str(garbage), "-o", str(tmp_path / "y.html")]) == 0
    err = capsys.readouterr().err
    assert "3 records skipped" in err and "Traceback" not in err


def test_read_run_applies_the_same_checks(bad_log):
    with pytest.raises(LogFormatError, match="a 'finding' record needs"):
        read_run(bad_log)
    skipped: list[str] = []
    data = read_run(bad_log, skipped=skipped)
    assert len(skipped) == len(BAD_RECORDS) and skipped[0].startswith("line ")
    assert "header's 'quantities' must be a list, got 5" in skipped[2]
    assert "header's 'params' must be a list, got 'x'" in skipped[3]
    assert data.output[20]["loss"] == 0.25
    follower = LogFollower(bad_log, "run")
    follower.poll()
    assert follower.series == scalar_series(data)


def _resumed_log(path):
    records = [{"kind": "header", "run": 1, "quantities": [{"name": "loss", "key": "loss"}]}]
    records += [{"kind": "values", "step": s, "values": {"loss": float(s)}} for s in range(6)]
    records += [{"kind": "metrics", "step": 5, "metrics": {"acc": 0.5}}]
    records += [{"kind": "header", "run": 2, "quantities": [{"name": "loss", "key": "loss"}]}]
    records += [{"kind": "resumed", "step": 3, "from_run": 1}]
    records += [{"kind": "values", "step": 3, "values": {"b": 1.0}}]  # completes step 3
    records += [{"kind": "values", "step": s, "values": {"loss": 10.0 + s}} for s in (4, 5)]
    records += [{"kind": "error", "step": 6, "quantity": "loss", "phase": "x", "error": "E"}]
    path.write_text("".join(dumps(r) + "\n" for r in records))
    return path


def test_a_resumed_run_shows_what_read_run_shows(tmp_path):
    log = _resumed_log(tmp_path / "log.jsonl")
    data = read_run(log)
    follower = LogFollower(log, "run")
    follower.poll()
    assert follower.data.output == data.output
    assert follower.series == scalar_series(data)
    assert follower.series["loss"] == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 14.0, 5: 15.0}
    assert follower.series["b"] == {3: 1.0}
    assert follower.series["metrics/acc"] == {5: 0.5}  # run 2 logged no metrics there
    page = write_page([log], tmp_path / "x.html", diagnose=False).read_text()
    found = re.search(r'<script id="cockpit-data" type="application/json">(.*?)</script>', page)
    panels = json.loads(found.group(1))["panels"]
    loss = next(t for p in panels if p["id"] == "loss" for t in p["figure"]["data"])
    assert loss["x"] == [0, 1, 2, 3, 4, 5] and loss["y"] == [0.0, 1.0, 2.0, 3.0, 14.0, 15.0]


def _get(port: int, route: str, host: str | None) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("GET", route, skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def test_host_header_is_checked(logged_run):
    with make_server([logged_run.log], port=0, allowed_hosts=["box.lan", "Other"]) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.server_address[1]
        try:
            for host in ("localhost", "127.0.0.1", "[::1]", "box.lan", "other", "LOCALHOST"):
                assert _get(port, "/data.json", f"{host}:{port}")[0] == 200, host
            for host in (
                f"evil.example:{port}",
                "evil.example",
                f"localhost:{port + 1 if port < 65535 else 1}",
                "localhost",
                f"localhost.evil.example:{port}",
                "",
                None,
            ):
                status, body = _get(port, "/", host)
                assert status == 403, host
                assert "Host not allowed" in body and "--allow-host" in body
        finally:
            server.shutdown()
            thread.join(5)


def test_serve_passes_allow_host(monkeypatch, logged_run):
    seen = {}
    monkeypatch.setattr("cockpit_web.command.serve", lambda runs, **kw: seen.update(kw))
    args = ["serve", str(logged_run.log), "--allow-host", "a", "--allow-host", "b.lan"]
    assert main([*args, "--port", "0", "--poll", "0.5"]) == 0
    assert seen["allowed_hosts"] == ["a", "b.lan"]
    assert seen["port"] == 0 and seen["poll_seconds"] == 0.5


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--port", "99999", "argument --port: a port is 0 (pick a free one) to 65535, got 99999"),
        ("--port", "-1", "argument --port: a port is 0 (pick a free one) to 65535, got -1"),
        ("--port", "http", "argument --port: expected a port number, got 'http'"),
        ("--poll", "inf", "argument --poll: must be a finite number of seconds above 0"),
        ("--poll", "nan", "argument --poll: must be a finite number of seconds above 0"),
        ("--poll", "-1", "argument --poll: must be a finite number of seconds above 0"),
        ("--poll", "1e308", "argument --poll: must be a finite number of seconds above 0"),
        ("--poll", "soon", "argument --poll: expected a number of seconds, got 'soon'"),
    ],
)
def test_serve_rejects_bad_port_and_poll(logged_run, capsys, option, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(logged_run.log), f"{option}={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_page_script_shows_the_warning_and_later_data(bad_log, tmp_path):
    from .test_browser import BROWSER, _attribute, dump_dom

    if BROWSER is None:
        pytest.skip("no headless browser (Debian's `chromium`)")
    with open(bad_log, "a") as f:  # a finding the page lists, after the bad ones
        f.write(
            dumps(
                {
                    "kind": "finding",
                    "id": "d@1",
                    "diagnosis": "dead_layers",
                    "severity": "info",
                    "first_step": 1,
                    "last_step": 2,
                    "message": "later",
                    "evidence": {},
                }
            )  # fmt: skip
            + "\n"
        )
    page = write_page([bad_log], tmp_path / "dash.html", diagnose=False)
    dom = dump_dom(page.as_uri(), tmp_path / "profile", budget_ms=2000)
    assert re.search(r'id="cockpit-errors"[^>]*>run: \d+ records skipped: line \d+', dom)
    assert "last step 20" in dom  # the status line was written: the script ran through
    assert _attribute(dom, "cockpit-findings", "data-count") == 1
