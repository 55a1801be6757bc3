"""The ``timers`` command end to end, run as a subprocess against the test server."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, Processes, run_cli, run_counts, runs, settled
from timers import Timers, TimerSpec
from timers.dev.server import free_port
from timers.listener.tuning.collector import YOUNG_THRESHOLD

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {text!r}"
    return lines[0]


def test_schedule_get_list_cancel(redis_url: str, timers_client: Timers) -> None:
    scheduled = run_cli("schedule", "reminders.sms", "[42]", "--in", "1s", "--url", redis_url)
    assert scheduled.returncode == 0, scheduled.stderr
    timer_id = _one_line(scheduled.stdout).strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]+", timer_id), timer_id
    pending = timers_client.get(timer_id)
    assert pending is not None
    assert (pending.task, pending.args) == ("reminders.sms", [42])

    got = run_cli("get", timer_id, "--url", redis_url)
    assert got.returncode == 0, got.stderr
    assert timer_id in got.stdout and "reminders.sms" in got.stdout and "[42]" in got.stdout

    listed = run_cli("list", "--url", redis_url)
    assert listed.returncode == 0, listed.stderr
    assert timer_id in listed.stdout and "reminders.sms" in listed.stdout

    cancelled = run_cli("cancel", timer_id, "--url", redis_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert timer_id in _one_line(cancelled.stdout)
    assert timers_client.get(timer_id) is None

    again = run_cli("cancel", timer_id, "--url", redis_url)
    assert again.returncode == 1
    assert again.stdout == ""
    assert timer_id in _one_line(again.stderr)

    gone = run_cli("get", timer_id, "--url", redis_url)
    assert gone.returncode == 0, gone.stderr
    assert "status:   cancelled" in gone.stdout and "reminders.sms" in gone.stdout
    never = run_cli("get", "never-was", "--url", redis_url)
    assert never.returncode == 1
    assert "never-was: unknown" in _one_line(never.stderr)


def test_listen_burst_fires_due_timers_then_exits(redis_url: str, r: redis.Redis,
                                                  timers_client: Timers) -> None:
    """``--burst`` exits once nothing is due and nothing runs. The lease (how long a crashed
    listener's runs wait before they run elsewhere) has nothing to do with that, so with a
    10-minute lease the command must still end well within the 20 s allowed here."""
    due_now = [f"b{i}" for i in range(6)]
    timers_client.schedule_many([TimerSpec("record.hit", [tid], in_=0, id=tid)
                                 for tid in due_now])
    timers_client.schedule("record.hit", ["later"], in_=3600, id="later")

    try:
        burst = run_cli("listen", "--burst", "--url", redis_url, "--tasks", TASKS,
                        "--concurrency", "4", "--lease", "600", url=redis_url, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("`timers listen --burst` was still running 20 s after its timers were "
                    f"due (ran: {dict(run_counts(r))}); it should exit once idle, not wait "
                    "for --lease")

    assert burst.returncode == 0, burst.stdout + burst.stderr
    assert "Traceback" not in burst.stderr
    assert run_counts(r) == Counter({tid: 1 for tid in due_now})
    assert timers_client.get("later") is not None, "a timer not yet due stays pending"


def test_listen_runs_tasks_with_the_app_frozen_out_of_the_collector_s_reach(
        redis_url: str, r: redis.Redis, timers_client: Timers) -> None:
    timers_client.schedule("record.collector_state", ["gc"], in_=0)

    burst = run_cli("listen", "--burst", "--url", redis_url, "--tasks", TASKS, url=redis_url)

    assert burst.returncode == 0, burst.stdout + burst.stderr
    (tag, young, frozen), = runs(r)
    assert (tag, young) == ("gc", YOUNG_THRESHOLD)
    assert frozen > 10_000, "the listener's and the app's objects are frozen"


def test_listen_burst_records_a_failing_timer_for_timers_failed(
        redis_url: str, timers_client: Timers) -> None:
    timers_client.schedule("fail.boom", ["cli"], in_=0, id="fails")

    burst = run_cli("listen", "--burst", "--url", redis_url, "--tasks", TASKS, url=redis_url)

    assert burst.returncode == 0, burst.stdout + burst.stderr
    failed = run_cli("failed", "--url", redis_url)
    assert failed.returncode == 0, failed.stderr
    assert "fails" in failed.stdout and "TaskBroke" in failed.stdout


def test_listen_fires_timers_and_stops_on_sigterm(
        redis_url: str, r: redis.Redis, timers_client: Timers, processes: Processes) -> None:
    listener = processes.timers("listen", "--url", redis_url, "--tasks", TASKS,
                                "--lease", "2")
    ids = [f"l{i}" for i in range(20)]
    timers_client.schedule_many(TimerSpec("record.hit", [tid], in_=0.3 + 0.02 * i, id=tid)
                                for i, tid in enumerate(ids))

    wait_until(lambda: (len(run_counts(r)) == 20 and settled(timers_client))
               or listener.poll() is not None, 20, message="`timers listen` to fire 20 timers")
    assert listener.poll() is None, processes.output(listener)
    assert run_counts(r) == Counter({tid: 1 for tid in ids})

    listener.send_signal(signal.SIGTERM)
    assert listener.wait(15) == 0, processes.output(listener)
    assert "Traceback" not in processes.output(listener)


def test_check_passes_on_the_test_server_and_fails_with_allkeys_eviction(
        redis_url: str, r: redis.Redis) -> None:
    ok = run_cli("check", "--url", redis_url)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    previous = r.config_get("maxmemory-policy")["maxmemory-policy"]
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        bad = run_cli("check", "--url", redis_url)
    finally:
        r.config_set("maxmemory-policy", previous)
    assert bad.returncode != 0, bad.stdout
    assert "maxmemory-policy" in bad.stdout and "allkeys-lru" in bad.stdout
    assert "noeviction" in bad.stdout
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("url", [
    pytest.param(f"redis://127.0.0.1:{free_port()}/0", id="nothing-listening"),
    pytest.param("localhost:6379", id="no-scheme"),
])
@pytest.mark.parametrize("command", [
    pytest.param(["list"], id="list"),
    pytest.param(["schedule", "reminders.sms", "[1]", "--in", "5s"], id="schedule"),
    pytest.param(["listen", "--burst", "--wait-for-redis", "0"], id="listen"),
    pytest.param(["check"], id="check"),
])
def test_bad_url_prints_one_clear_line(url: str, command: list[str]) -> None:
    result = run_cli(*command, "--url", url)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    line = _one_line(result.stderr)
    assert line.startswith("error:"), line
    assert url in line or "URL" in line or "connect" in line, line


def test_views_read_past_a_heartbeat_another_app_wrote_junk_into(
        redis_url: str, r: redis.Redis) -> None:
    r.zadd("timers|listeners", {"junk": 2 ** 50})
    r.hset("timers|listener", "junk", json.dumps(
        {"id": "junk", "groups": 5, "started": "x", "pid": [1], "running": {"a": 1}}))
    for command in (["listeners"], ["stats"], ["top"]):
        done = run_cli(*command, "--url", redis_url)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr)
    assert "junk" in run_cli("listeners", "--url", redis_url).stdout
