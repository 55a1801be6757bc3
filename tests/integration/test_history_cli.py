"""The run history on a real server through the command line: ``timers get`` on each end
state and on an id past retention, ``timers history`` and its filters, and a listener
process's history options."""

from __future__ import annotations

import hashlib
import time

import pytest
import redis

from tests.conftest import wait_until
from tests.history_layout import records_of, write_history
from tests.integration.helpers import TASKS, Processes, run_cli
from timers import Timers
from timers.listener.endings.history import TRIM_BUDGET
from timers.model.history import TimerState
from timers.model.keys import DEFAULT_PREFIX, Keyspace
from timers.store.lua_source import script_library, source

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def burst(redis_url: str, *options: str) -> None:
    done = run_cli("listen", "--burst", "--url", redis_url, "--tasks", TASKS, *options,
                   url=redis_url, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_get_says_how_each_timer_ended_and_history_lists_them(
        redis_url: str, timers_client: Timers) -> None:
    timers_client.schedule("record.hit", ["old"], in_=0, id="old")
    burst(redis_url, "--history-count", "3")
    timers_client.schedule("record.hit", ["ok"], in_=0, id="ok")
    timers_client.schedule("fail.boom", ["x"], in_=0, id="dead")
    timers_client.schedule("record.hit", ["off"], in_=3600, id="off")
    assert timers_client.cancel("off")
    burst(redis_url, "--history-count", "3")  # the three newest ends: "old" is past it

    for timer_id, state in (("ok", "completed"), ("dead", "dead"), ("off", "cancelled")):
        got = run_cli("get", timer_id, "--url", redis_url)
        assert got.returncode == 0, got.stderr
        assert f"status:   {state}" in got.stdout, got.stdout
    assert "error:" in run_cli("get", "dead", "--url", redis_url).stdout
    assert timers_client.status("old").state is TimerState.UNKNOWN
    past = run_cli("get", "old", "--url", redis_url)
    assert past.returncode == 1 and "old: unknown" in past.stderr

    listed = run_cli("history", "--url", redis_url).stdout.splitlines()
    assert listed[0].split()[:2] == ["ENDED", "(UTC)"]
    assert {line.split()[3] for line in listed[1:]} == {"ok", "dead", "off"}
    failed = run_cli("history", "--failed", "--since", "1h", "--url", redis_url).stdout
    assert [line.split()[3] for line in failed.splitlines()[1:]] == ["dead"]
    by_task = run_cli("history", "--task", "record.hit", "-n", "1", "--url", redis_url).stdout
    assert len(by_task.splitlines()) == 2


def test_a_listener_process_writes_series_and_zero_keeps_no_history(
        redis_url: str, timers_client: Timers) -> None:
    timers_client.schedule_many([{"task": "record.hit", "args": [str(i)], "in_": 0}
                                 for i in range(5)])
    burst(redis_url, "--history-count", "0")
    assert timers_client.history() == []
    assert wait_until(lambda: sum(m.runs for m in timers_client.series("record.hit", 2)) == 5,
                      5.0)
    assert timers_client.tasks_seen() == ["record.hit"]


def test_a_task_count_keeps_its_newest_ends(redis_url: str, timers_client: Timers) -> None:
    def ended(tags: range) -> None:
        timers_client.schedule_many([{"task": "record.counted", "args": [f"c{i}"], "in_": 0,
                                      "id": f"c{i}"} for i in tags])

    ended(range(7))
    timers_client.schedule("record.hit", ["other"], in_=0, id="other")
    burst(redis_url)
    ended(range(7, 10))  # ten runs of it in all, these three the newest
    burst(redis_url)

    listed = run_cli("history", "--task", "record.counted", "--url", redis_url).stdout
    assert {line.split()[3] for line in listed.splitlines()[1:]} == {"c7", "c8", "c9"}
    past = run_cli("get", "c0", "--url", redis_url)
    assert past.returncode == 1 and "c0: unknown" in past.stderr
    assert "history_count=" in past.stderr, "it names where a task's count is set"
    assert timers_client.status("other").state is TimerState.COMPLETED  # no count of its own
    timers_client.schedule("record.counted", ["off"], in_=3600, id="off")
    assert timers_client.cancel("off")  # a cancel counts too
    kept = {r.id for r in timers_client.history(task="record.counted")}
    assert len(kept) == 3 and "off" in kept


TRIM_SHA = hashlib.sha1(source("trim").encode()).hexdigest()
TRIM_FUNCTION = f"{script_library()[0]}_trim"


def main_thread_cpu(r: redis.Redis) -> float:
    """Seconds of CPU the server's main thread has used."""
    info = r.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def trim_calls_us(r: redis.Redis) -> list[int]:
    """How long (µs) each trim call the server logged took, as a function of the library or
    by EVALSHA."""
    return [int(entry["duration"]) for entry in r.slowlog_get(100_000)
            if entry["command"].startswith((f"FCALL {TRIM_FUNCTION} ".encode(),
                                            f"EVALSHA {TRIM_SHA}".encode()))]


def test_an_idle_listener_trims_a_lowered_count_in_short_steps(
        redis_url: str, processes: Processes) -> None:
    # 200,000 records (a tenth written by 0.1.0, without the index), then a
    # listener started with --history-count 20000 and nothing to run: it gets there within
    # the deadline, in calls that each hold Redis a few ms at most (every command logged).
    r = redis.Redis.from_url(redis_url)
    keys = Keyspace(DEFAULT_PREFIX)
    seconds, micros = r.time()
    now = seconds * 1000 + micros // 1000
    write_history(r, keys, records_of(20_000, now - 120_000, prefix="o", dead_every=100),
                  ended_ms=now - 120_000, expiry_ms=now + 86_400_000, indexed=False)
    write_history(r, keys, records_of(180_000, now - 100_000, dead_every=100),
                  ended_ms=now - 100_000, expiry_ms=now + 86_400_000)
    assert r.hlen(keys.history_records) == 200_000
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()
    cpu = main_thread_cpu(r)
    try:
        processes.timers("listen", "--url", redis_url, "--tasks", TASKS,
                         "--history-count", "20000")
        started = time.monotonic()
        wait_until(lambda: r.hlen(keys.history_records) == 20_000, 120,
                   message="the history trimmed to 20,000 records")
        took = time.monotonic() - started
        cpu = main_thread_cpu(r) - cpu
        calls = sorted(trim_calls_us(r))
    finally:
        r.config_set("slowlog-log-slower-than", 10_000)
        r.config_set("slowlog-max-len", 128)
    median, over = calls[len(calls) // 2], sum(1 for us in calls if us > 5_000)
    per_call = cpu / len(calls) * 1e6
    print(f"\n200,000 -> 20,000 records idle in {took:.1f} s (listener start included), "
          f"{len(calls)} trim calls: median {median} us, {over} over 5 ms, slowest "
          f"{calls[-1]} us; Redis's CPU {per_call:,.0f} us a call")
    assert len(calls) >= 180_000 // TRIM_BUDGET
    # SLOWLOG times a call on the wall clock: on a loaded host (2 cores, load 10 to 15) a
    # call of about 1.5 ms reads 5 to 40 ms now and then (2 to 12 in 100; once 640 ms),
    # Redis waiting for a core during it; so the work is judged by the median and by
    # Redis's own CPU time, which a call doing more work raises every time
    assert median <= 2_500, f"the median trim call held Redis {median} us"
    assert per_call <= 3_000, f"Redis spent {per_call:,.0f} us of CPU a trim call"
    # what is kept is the newest, and its indexes hold it and nothing more
    assert r.zcard(keys.history_task("reminders.sms")) == 20_000
    assert r.zcard(keys.history_failed) == 200
    with Timers(redis_url) as t:
        assert len(t.history(failed=True, limit=1000)) == 200
    r.close()
