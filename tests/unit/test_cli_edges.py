"""Edges of the command line met in real use: ARGS_JSON nested 50,000 deep, a missing due
time, connection errors in one wording, task tracebacks without timers' frames, the
columns of ``timers list`` with long ids."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from types import ModuleType

import fakeredis
import pytest
import redis

import timers
from tests.unit.helpers import run_burst
from timers import Timers
from timers.cli import app
from timers.cli import cron as cli_cron
from timers.cli import failed as cli_failed
from timers.cli import top as cli_top
from timers.cli import views as cli_views
from timers.cli.errors import run_app
from timers.model.tracebacks import from_task_frames
from timers.store.server_errors import cannot_connect, connect_reason, url_address

TIMERS_DIR = os.path.dirname(os.path.abspath(timers.__file__))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_app(app, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def through(monkeypatch: pytest.MonkeyPatch, command: ModuleType, producer: Timers) -> None:
    """Make ``command``'s module use ``producer`` (left open) instead of a client of its
    own."""
    monkeypatch.setattr(command, "open_timers", lambda url, prefix: producer)
    monkeypatch.setattr(producer, "close", lambda: None)


def fields(lines: list[str]) -> dict[str, str]:
    """``label: value`` lines (as ``timers get`` prints them) by label."""
    return {label: value.strip() for label, _, value in (line.partition(":") for line in lines)}


@pytest.mark.parametrize("command", [["schedule", "x"], ["cron", "add", "n", "x"]])
def test_args_nested_50000_deep_is_one_usage_error(capsys: pytest.CaptureFixture[str],
                                                   command: list[str]) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    when = ["--in", "1s"] if command[0] == "schedule" else ["--every", "5m"]
    code, out, err = run(capsys, *command, deep, *when)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("error: invalid value for 'ARGS_JSON': "
                                                   "nested too deeply"), err
    assert "Recursion" not in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["schedule", "x", "[1]"],                              # neither --in nor --at
    ["schedule", "x", "[1]", "--in", "1s", "--at", "2026-01-01T00:00:00Z"],  # both
    ["reschedule", "some-id"],
    ["schedule", "x", "[1", "--in", "1s"],                 # ARGS_JSON that does not parse
])
def test_a_command_line_that_does_not_say_what_to_do_exits_2(
        capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert f"(see timers {argv[0]} --help)" in err


def _refused() -> redis.exceptions.ConnectionError:
    """redis-py's error for a refused connection, as the sync client raises it."""
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise redis.exceptions.ConnectionError(
                "Error 111 connecting to localhost:6391. Connection refused.") from exc
    except redis.exceptions.ConnectionError as error:
        return error


@pytest.mark.parametrize(("error", "reason"), [
    (_refused(), "connection refused"),
    # the asyncio client: another text, the same errno
    (redis.exceptions.ConnectionError("Error 111 connecting to localhost:6391. Connect call "
                                      "failed ('127.0.0.1', 6391)."), "connection refused"),
    (redis.exceptions.ConnectionError("Error Multiple exceptions: [Errno 111] Connect call "
                                      "failed ('::1', 6391, 0, 0)"), "connection refused"),
    (redis.exceptions.ConnectionError("Error -2 connecting to nohost.invalid:6379. Name or "
                                      "service not known."), "name or service not known"),
    (redis.exceptions.TimeoutError("Timeout connecting to server"), "timed out"),
])
def test_connection_errors_have_one_wording(error: Exception, reason: str) -> None:
    assert connect_reason(error) == reason
    assert cannot_connect("localhost:6391", error) == \
        f"cannot connect to Redis at localhost:6391: {reason}"


def test_urls_are_named_as_clients_name_their_server() -> None:
    assert url_address("redis://:sekret@localhost:6391/0") == "localhost:6391"
    assert url_address("rediss://cache.example/2") == "cache.example:6379"
    assert url_address("unix:///run/redis.sock?db=1") == "/run/redis.sock"


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A URL where nothing listens (the port was bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"


@pytest.mark.parametrize("command", [["list"], ["stats"], ["check"], ["cancel", "x"],
                                     ["failed", "list"], ["schedule", "x", "--in", "1s"],
                                     ["cron", "list"]])
def test_every_command_words_a_refused_connection_the_same(
        capsys: pytest.CaptureFixture[str], refused_url: str, command: list[str]) -> None:
    code, _, err = run(capsys, *command, "--url", refused_url)
    port = refused_url.rsplit(":", 1)[1].split("/")[0]
    assert code == 1
    assert err == f"error: cannot connect to Redis at 127.0.0.1:{port}: connection refused\n"


def _traceback(*frames: str, exception: str = "ValueError: bad") -> str:
    lines = ["Traceback (most recent call last):"]
    for path in frames:
        lines += [f'  File "{path}", line 3, in f', "    call()", "    ^^^^^^"]
    return "\n".join([*lines, exception, ""])


def test_task_tracebacks_start_at_the_task() -> None:
    runner = f"{TIMERS_DIR}/listener/calling/runner.py"
    pool = os.path.join(os.path.dirname(contextlib.__file__), "concurrent/futures/thread.py")
    task, lib = "/srv/app/tasks/mail.py", "/srv/app/.venv/lib/python3.11/site-packages/x.py"
    text = _traceback(runner, pool, task, lib, f"{TIMERS_DIR}/client.py")
    trimmed = from_task_frames(text)
    assert "runner.py" not in trimmed and "thread.py" not in trimmed
    assert trimmed.splitlines()[:3] == ["Traceback (most recent call last):",
                                       "  [2 frame(s) that called the task left out]",
                                       f'  File "{task}", line 3, in f']
    # what the task called (site-packages, timers itself) stays
    assert lib in trimmed and f"{TIMERS_DIR}/client.py" in trimmed
    assert trimmed.endswith("ValueError: bad\n")


def test_each_traceback_of_a_chain_is_trimmed_and_timers_own_errors_kept_whole() -> None:
    runner = f"{TIMERS_DIR}/listener/calling/runner.py"
    chained = (_traceback(runner, "/app/tasks/a.py", exception="KeyError: 'k'")
               + "\nDuring handling of the above exception, another exception occurred:\n\n"
               + _traceback(runner, "/app/tasks/a.py"))
    trimmed = from_task_frames(chained)
    assert "runner.py" not in trimmed and trimmed.count("/app/tasks/a.py") == 2
    assert "During handling" in trimmed and "KeyError: 'k'" in trimmed
    only_ours = _traceback(runner, f"{TIMERS_DIR}/loader.py")
    assert from_task_frames(only_ours) == only_ours
    assert from_task_frames("no traceback here") == "no traceback here"


def test_list_columns_fit_the_longest_id(capsys: pytest.CaptureFixture[str],
                                         producer: Timers,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    producer.schedule("reminders.sms", [1], in_=60, id="order-expiry-000000042")  # 22 chars
    producer.schedule("reminders.sms", [2], in_=120, id="short")
    through(monkeypatch, cli_views, producer)
    code, out, _ = run(capsys, "list")
    assert code == 0
    header, *rows = out.splitlines()
    starts = {line.index(word) for line, word in
              [(header, "TASK"), *((row, "reminders.sms") for row in rows)]}
    assert len(starts) == 1, out
    assert header.index("ID") == rows[0].index("order-expiry-") == rows[1].index("short")


def test_cron_args_that_do_not_parse_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "cron", "add", "x", "mod.f", "{bad", "--every", "5m")
    assert code == 2 and "not valid JSON" in err and err.count("\n") == 1


def test_failed_columns_start_under_their_headings(
        capsys: pytest.CaptureFixture[str], server: fakeredis.FakeServer, producer: Timers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    producer.schedule("mod.boom", ["bad input"], in_=0, id="dead-one")
    run_burst(server)
    through(monkeypatch, cli_failed, producer)
    code, out, _ = run(capsys, "failed")
    assert code == 0
    header, row = out.splitlines()
    for heading, value in (("KIND", "error"), ("ID", "dead-one"), ("TASK", "mod.boom"),
                           ("ERROR", "ValueError: bad input")):
        assert header.index(heading) == row.index(value), out


def test_top_quits_on_q_and_refreshes_on_while_no_key_is_pressed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)  # a read with nothing typed fails here instead of waiting
    with os.fdopen(read) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert not cli_top._quit_pressed(0.01)  # nothing typed: the view goes on
        os.write(write, b"x")
        assert not cli_top._quit_pressed(0.01)
        os.write(write, b"Q")
        assert cli_top._quit_pressed(0.01)
    os.close(write)


def test_cron_list_names_each_policy_that_is_not_the_default(
        capsys: pytest.CaptureFixture[str], producer: Timers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    producer.every("plain", "reminders.sms", interval=60)
    producer.every("all-of-them", "reminders.sms", interval=60, catch_up="all",
                   max_lateness=30, overlap=False)
    through(monkeypatch, cli_cron, producer)
    code, out, _ = run(capsys, "cron", "list")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "every 1m catch-up=all max-lateness=30.0s no-overlap " in rows["all-of-them"], out
    assert "catch-up" not in rows["plain"] and "overlap" not in rows["plain"], out


def test_get_of_an_ended_timer_says_how_it_ended_line_by_line(
        capsys: pytest.CaptureFixture[str], server: fakeredis.FakeServer, producer: Timers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    producer.schedule("mod.add", [1], in_=0, id="done")
    producer.schedule("mod.add", [2], in_=60, id="off")
    producer.cancel("off")
    listener = run_burst(server)
    through(monkeypatch, cli_views, producer)
    code, out, _ = run(capsys, "get", "done")
    lines = fields(out.splitlines())
    assert code == 0 and lines["task"] == "mod.add" and lines["listener"] == listener.id, out
    assert lines["ran"].endswith(" ms") and lines["late"].endswith(
        " ms (start after its due time)"), out
    code, out, _ = run(capsys, "get", "off")
    lines = fields(out.splitlines())
    assert code == 0 and ":" in lines["by"] and "late" not in lines and "ran" not in lines, out


def test_get_of_a_dead_timer_past_the_history_says_it_from_its_failure_record(
        capsys: pytest.CaptureFixture[str], server: fakeredis.FakeServer, producer: Timers,
        fake: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    producer.schedule("mod.boom", ["bad input"], in_=0, id="dead-one")
    run_burst(server)
    fake.hdel(producer.keys.history_records, "dead-one")  # past the history's retention
    through(monkeypatch, cli_views, producer)
    code, out, _ = run(capsys, "get", "dead-one")
    *said, last = out.splitlines()
    lines = fields(said)
    assert code == 0 and lines["status"] == "dead" and lines["task"] == "mod.boom", out
    assert lines["attempts"] == "1" and lines["error"] == "ValueError: bad input", out
    assert last == "(its history record is past retention; timers failed shows the rest)"


def test_get_of_a_pending_timer_says_what_it_is_line_by_line(
        capsys: pytest.CaptureFixture[str], producer: Timers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    producer.schedule("reminders.sms", ["+1 555", "hi"], in_=3600, id="p1", group="sms",
                      priority=5, key="user:7")
    through(monkeypatch, cli_views, producer)
    code, out, _ = run(capsys, "get", "p1")
    lines = fields(out.splitlines())
    assert code == 0 and lines["status"] == "pending" and lines["task"] == "reminders.sms", out
    assert lines["args"] == '["+1 555", "hi"]' and " (in 59m " in lines["due"], out
    assert (lines["attempts"], lines["group"], lines["priority"], lines["key"]) == (
        "0 (failed runs so far)", "sms", "5", "user:7"), out
