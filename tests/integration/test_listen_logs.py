"""What ``timers listen`` writes to stderr: one JSON object per line under ``--processes 2``,
the pid in every text line, a line per fired timer, and "stopped" at the end.

Everything here runs the real ``timers`` command as a subprocess, in ``--burst`` mode, so
it exits once the timers scheduled before it are done.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import redis

from tests.conftest import ROOT
from tests.integration.helpers import TIMERS_COMMAND, subprocess_env
from tests.task_pkg import URL_ENV
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TASKS = "tests.task_pkg"


def listen(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env()
    env[URL_ENV] = redis_url
    env.pop("TIMERS_LOG_FORMAT", None)
    return subprocess.run(
        [TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", TASKS, "--burst", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_json_lines_under_two_processes(timers_client: Timers, redis_url: str,
                                        r: redis.Redis) -> None:
    ids = timers_client.schedule_many(
        [TimerSpec("record.hit", [f"t{i}"], in_=0) for i in range(12)]
        + [TimerSpec("fail.boom", ["x"], in_=0, id="will-fail")])

    done = listen(redis_url, "--processes", "2", "--log-format", "json", "--log-fires")

    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(isinstance(rec, dict) for rec in records)
    for rec in records:
        assert {"ts", "level", "logger", "message", "pid", "listener"} <= rec.keys(), rec
        assert rec["ts"].endswith("Z")
    supervisor = {rec["pid"] for rec in records if rec["role"] == "supervisor"}
    children = {rec["pid"] for rec in records if rec["role"] == "listener"}
    assert len(supervisor) == 1 and len(children) == 2, (supervisor, children)
    for rec in records:
        if rec["role"] == "listener":  # a child names its listener id, which holds its pid
            assert f":{rec['pid']}:" in rec["listener"], rec

    fires = [rec for rec in records if rec["logger"] == "timers.fires"]
    assert sorted(rec["id"] for rec in fires) == sorted(ids), "one line per fired timer"
    for rec in fires:
        assert rec["task"] in ("record.hit", "fail.boom")
        assert isinstance(rec["lateness_ms"], float) and isinstance(rec["duration_ms"], float)
    outcomes = {rec["id"]: rec["outcome"] for rec in fires}
    assert outcomes.pop("will-fail") == "failed"
    assert set(outcomes.values()) == {"ok"}
    assert r.llen("test:runs") == 12

    stopped = [rec for rec in records if rec["message"].startswith("stopped")]
    assert {rec["pid"] for rec in stopped} == supervisor | children
    assert sum(rec["fired"] for rec in stopped if rec["role"] == "listener") == 13
    assert records[-1]["role"] == "supervisor" and records[-1]["message"].startswith("stopped")


def test_text_lines_name_the_pid_and_end_with_stopped(timers_client: Timers,
                                                      redis_url: str) -> None:
    timers_client.schedule("record.hit", ["a"], in_=0, id="first")
    timers_client.schedule("fail.boom", ["b"], in_=0, id="second")

    done = listen(redis_url, "--log-fires")

    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    pids = {m.group(1) if (m := re.search(r" \[pid (\d+) listener ", line)) else None
            for line in lines}
    assert len(pids) == 1 and None not in pids, done.stderr
    fired = [line for line in lines if "timers.fires: fired" in line]
    assert any("fired first (record.hit) attempt 1: ok" in line for line in fired), fired
    assert any("fired second (fail.boom) attempt 1: failed (TaskBroke)" in line
               for line in fired), fired
    assert "stopped: 2 run(s) fired: 1 ok, 1 failed" in lines[-1], lines[-1]


def test_a_bad_log_format_is_one_line(redis_url: str) -> None:
    done = listen(redis_url, "--log-format", "xml")
    assert done.returncode == 1
    assert done.stderr == "error: --log-format must be text or json, got 'xml'\n"


def test_a_line_break_in_a_timer_id_or_an_error_does_not_start_a_text_line(
        timers_client: Timers, redis_url: str) -> None:
    """A line that starts with a date and a level is one event: a timer id or an exception
    message cannot forge one."""
    forged = "2026-01-01 00:00:00,000 INFO [pid 1 listener x] timers.listener: forged"
    timers_client.schedule("fail.boom", [f"two\n{forged}"], in_=0, id=f"id\r\n{forged}")

    done = listen(redis_url, "--log-fires")

    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith(forged)] == []
    assert "failed for good" in done.stderr and "TaskBroke: boom two\\n2026" in done.stderr


def test_a_recycling_supervisor_of_one_process_says_it_is_the_supervisor(
        timers_client: Timers, redis_url: str) -> None:
    timers_client.schedule("record.hit", ["a"], in_=0)

    done = listen(redis_url, "--max-runs-per-child", "5", "--log-format", "json")

    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    supervisor = "timers.listener.supervision.supervisor"
    roles = {rec["role"] for rec in records if rec["logger"] == supervisor}
    assert roles == {"supervisor"}, done.stderr
    assert all(rec["listener"] for rec in records if rec["role"] == "listener"), done.stderr
