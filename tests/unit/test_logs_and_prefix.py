"""Log lines of ``timers listen`` (formats, fire lines, hand-back ids), ``$TIMERS_PREFIX``
as the default prefix, and ``listen --help`` as the installed command prints it (its entry
point, run in this process)."""

from __future__ import annotations

import json
import logging
import os
import sys

import fakeredis
import fakeredis.aioredis
import pytest

from timers import AsyncTimers, Timers
from timers.cli import app
from timers.cli.app import main
from timers.cli.errors import run_app
from timers.listener.endings.ending import Ending, Executed
from timers.listener.health.tally import RunTally, some_ids
from timers.logs import TEXT_FORMAT, Identity, JsonFormatter, configured_format
from timers.model.keys import configured_prefix
from timers.model.runs import Fired, Outcome
from timers.model.wire import EndingKind


def record(message: str, **extra: object) -> logging.LogRecord:
    rec = logging.getLogger("timers.listener").makeRecord(
        "timers.listener", logging.WARNING, __file__, 1, message, (), None, extra=extra)
    Identity().filter(rec)
    return rec


def test_json_line_is_one_object_with_the_exception_as_a_string() -> None:
    try:
        raise ValueError("line one\nline two")
    except ValueError:
        rec = logging.getLogger("x").makeRecord("x", logging.ERROR, __file__, 1, "it broke",
                                                (), sys.exc_info(), extra={"id": "t1"})
    identity = Identity()
    identity.listener = "host:42:abc"
    identity.filter(rec)
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "it broke" and data["level"] == "ERROR" and data["id"] == "t1"
    assert data["listener"] == "host:42:abc" and data["pid"] == os.getpid()
    assert data["ts"].endswith("Z") and "T" in data["ts"]
    assert "ValueError: line one\nline two" in data["exception"]


def test_text_line_names_the_pid_and_the_role_before_the_listener_id() -> None:
    text = logging.Formatter(TEXT_FORMAT).format(record("hello"))
    assert f"WARNING [pid {os.getpid()} listener] timers.listener: hello" in text


def test_log_format_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_LOG_FORMAT", "JSON")
    assert configured_format() == "json"
    assert configured_format("text") == "text"
    monkeypatch.setenv("TIMERS_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match=r"^\$TIMERS_LOG_FORMAT must be text or json, got "):
        configured_format()


def test_hand_back_names_the_ids_capped(caplog: pytest.LogCaptureFixture) -> None:
    ids = [f"t{i}" for i in range(25)]
    assert some_ids(ids[:2]) == "t0, t1"
    assert some_ids(ids).endswith("t19 … and 5 more")
    with caplog.at_level(logging.INFO):
        tally = RunTally()
        tally.hand_back(ids)
        tally.log_stopped()
    first, last = caplog.records
    assert first.getMessage() == ("handing back 25 unfinished run(s) to run elsewhere: "
                                  + some_ids(ids))
    assert "0 run(s) fired" in last.getMessage() and "25 handed back" in last.getMessage()


def test_fire_lines_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    fired = Fired("t\n1", "mod.fn", 1000, 1012.5, 1030.0, "event", 2,
                  Outcome("error", "KeyError", "k"))
    done = Executed(Ending("tok", EndingKind.RETRY), fired)
    with caplog.at_level(logging.INFO):
        RunTally().ended(done)
        assert not caplog.records
        RunTally(log_fires=True).ended(done)
    (line,) = caplog.records
    assert line.getMessage() == ("fired t\\n1 (mod.fn) attempt 2: retry (KeyError), "
                                 "12.5 ms late, ran 17.5 ms")
    assert line.__dict__["outcome"] == "retry" and line.__dict__["lateness_ms"] == 12.5


def test_prefix_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_PREFIX", "shop")
    assert Timers(fakeredis.FakeRedis()).keys.prefix == "shop"
    assert AsyncTimers(fakeredis.aioredis.FakeRedis()).keys.prefix == "shop"
    assert Timers(fakeredis.FakeRedis(), prefix="other").keys.prefix == "other"
    monkeypatch.setenv("TIMERS_PREFIX", "")
    assert configured_prefix() == "timers"
    monkeypatch.setenv("TIMERS_PREFIX", "a:b")
    with pytest.raises(ValueError, match=r"^\$TIMERS_PREFIX must be non-empty and free of"):
        Timers(fakeredis.FakeRedis())


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str],
             monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """The installed ``timers`` command (its entry point, :func:`timers.cli.app.main`) run
    in this process on ``argv``: its exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "argv", ["timers", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def test_a_bad_prefix_in_the_environment_is_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_PREFIX", "a|b")
    code, _, err = run_main(["stats"], capsys, monkeypatch)
    assert code == 2
    assert err.startswith("error: invalid value for '--prefix': $TIMERS_PREFIX must "
                          "be non-empty and free of ':', '|'"), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("columns", ["60", "200"])
def test_listen_help_shows_the_defaults(columns: str, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setenv("TERM", "xterm-256color")
    code, out, err = run_main(["listen", "--help"], capsys, monkeypatch)
    text = " ".join(out.split())
    assert code == 0, err
    assert ("Package whose functions timers may run, found on PYTHONPATH, then in the "
            "working directory [default: $TIMERS_TASKS or tasks]") in text, text
    assert "[default: $TIMERS_PREFIX or timers]" in text
    assert "[default: $TIMERS_LOG_FORMAT or text]" in text and "--log-fires" in text


def test_the_demo_keeps_its_own_prefix(capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_PREFIX", "shop")
    assert run_app(app, ["demo", "--help"]) == 0
    assert "[default: timers-demo]" in " ".join(capsys.readouterr().out.split())
    assert run_app(app, ["demo", "--prefix", "a|b"]) == 2
    assert "invalid value for '--prefix': prefix must be non-empty" in capsys.readouterr().err


def test_a_json_line_with_a_huge_traceback_fits_one_atomic_pipe_write() -> None:
    """Children under --processes share one stderr: a line longer than PIPE_BUF could be
    split by another child's line, and neither would parse."""
    from timers.logs import MAX_LINE_BYTES, JsonFormatter

    try:
        raise ValueError("é" * 3000 + " the end")
    except ValueError:
        record = logging.LogRecord("timers.listener", logging.ERROR, __file__, 1,
                                   "task failed: %s", ("x" * 3000,), sys.exc_info())
    line = JsonFormatter().format(record)
    assert len(line.encode()) <= MAX_LINE_BYTES
    parsed = json.loads(line)
    assert parsed["exception"].startswith("Traceback (most recent call last)")
    assert parsed["exception"].endswith("é the end")
    assert "characters cut" in parsed["exception"]
    assert parsed["message"].startswith("task failed: xxx")


@pytest.mark.parametrize("prefix", ["myapp ", " myapp", "tab\there", "esc\x1b", "del\x7f", " "])
def test_a_prefix_that_would_split_an_app_silently_is_refused(
        prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``TIMERS_PREFIX="myapp "`` in one service's environment and ``myapp`` in another's
    would put producer and listener on different keys, and no timer would ever fire."""
    monkeypatch.setenv("TIMERS_PREFIX", prefix)
    with pytest.raises(ValueError, match=r"^\$TIMERS_PREFIX must be non-empty and free of "
                                         r"':', '\|' and control characters, with no space "
                                         r"at either end, got "):
        Timers(fakeredis.FakeRedis())
    with pytest.raises(ValueError, match=r"^prefix must be non-empty"):
        AsyncTimers(fakeredis.aioredis.FakeRedis(), prefix=prefix)


@pytest.mark.parametrize("prefix", ["my app", "приложение✓", "x" * 300])
def test_odd_but_valid_prefixes_are_kept_as_given(prefix: str) -> None:
    assert Timers(fakeredis.FakeRedis(), prefix=prefix).keys.prefix == prefix
