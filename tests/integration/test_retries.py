"""Retries, dead timers and what the CLI does with them; max_lateness; task timeouts.

Listeners run in this process (``start_listener``) so their :class:`Fired` reports give the
attempt numbers; the tasks in ``tests/retry_tasks`` record every call in Redis.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import redis

import timers
from tests.conftest import wait_until
from tests.integration.helpers import (
    KEYS,
    ListenerThread,
    redis_now,
    redis_now_ms,
    run_cli,
    settled,
)
from tests.retry_tasks import FIXED, RELEASE, calls, done
from tests.retry_tasks.late import TASK_MAX_LATENESS
from tests.retry_tasks.slow import TIMEOUT
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TASKS = "tests.retry_tasks"


@pytest.fixture
def listen(start_listener: Callable[..., ListenerThread]) -> Callable[..., ListenerThread]:
    """``listen(**options)``: a listener thread running ``tests.retry_tasks``."""

    def start(**options: object) -> ListenerThread:
        options.setdefault("tasks", TASKS)
        return start_listener(**options)

    return start


def attempts_of(listener: ListenerThread, timer_id: str) -> list[tuple[int, str]]:
    """``(attempt, outcome kind)`` of every run of ``timer_id``, in the order they ended."""
    return [(f.attempt, f.outcome.kind) for f in listener.reports() if f.timer_id == timer_id]


def calls_of(r: redis.Redis, tag: str) -> list[int]:
    return [n for t, n in calls(r) if t == tag]


def failures_by_id(t: Timers) -> dict[str | None, dict[str, object]]:
    return {f.timer_id: f.data for f in t.failed()}


# -- retries ----------------------------------------------------------------------------


def test_task_failing_twice_is_retried_under_the_same_id_and_then_succeeds(
        timers_client: Timers, r: redis.Redis, listen) -> None:
    listener = listen()
    tid = timers_client.schedule("flaky.twice", ["flaky"], in_=0.05, id="flaky-1")
    wait_until(lambda: done(r) == [["flaky", "ok"]] and settled(timers_client), 10,
               message="the third attempt to succeed")

    assert calls_of(r, "flaky") == [1, 2, 3]
    assert attempts_of(listener, tid) == [(1, "error"), (2, "error"), (3, "ok")]
    assert {f.timer_id for f in listener.reports()} == {"flaky-1"}
    assert timers_client.failed() == []
    assert timers_client.get(tid) is None
    counters = timers_client.stats().counters
    assert counters.get("retried") == 2
    assert counters.get("fired") == 1
    assert counters.get("failed", 0) == 0


def test_task_always_failing_ends_as_one_failure_record(
        timers_client: Timers, r: redis.Redis, listen, redis_url: str) -> None:
    listener = listen()
    before = redis_now_ms(r)
    tid = timers_client.schedule("flaky.always", ["dead"], in_=0.05, id="always-1")
    wait_until(lambda: timers_client.failed() and settled(timers_client), 10,
               message="the timer to fail for good")
    after = redis_now_ms(r)

    assert calls_of(r, "dead") == [1, 2, 3]
    assert attempts_of(listener, tid) == [(1, "error"), (2, "error"), (3, "error")]
    (failure,) = timers_client.failed()
    assert failure.timer_id == tid and failure.failure_id.startswith(f"{tid}:")
    d = failure.data
    # the timer's own due time, not its last attempt's (issue 9 row 16)
    assert before <= d["due_ms"] < d["first_failure"]
    assert (d["task"], d["args"], d["kind"]) == ("flaky.always", ["dead"], "error")
    assert d["attempts"] == 3
    assert d["error_type"] == "Flaky"
    assert d["message"] == "dead always fails (call 3)"
    assert "Traceback (most recent call last)" in d["traceback"]
    assert 'raise Flaky(f"{tag} always fails (call {n})")' in d["traceback"]
    assert "timers/listener/" not in d["traceback"]  # written from the task's frames on
    assert isinstance(d["first_failure"], int) and isinstance(d["failed_at"], int)
    assert before <= d["first_failure"] <= d["failed_at"] <= after
    assert timers_client.get_failure(tid) == failure
    counters = timers_client.stats().counters
    assert (counters.get("retried"), counters.get("failed"), counters.get("fired", 0)) == (
        2, 1, 0)

    listed = run_cli("failed", "list", "--url", redis_url)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if tid in line]
    assert "error" in row and "flaky.always" in row
    assert "Flaky: dead always fails (call 3)" in row
    bare = run_cli("failed", "--url", redis_url)
    assert bare.returncode == 0 and bare.stdout == listed.stdout

    shown = run_cli("failed", "show", tid, "--url", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert "attempts:      3" in shown.stdout
    assert "error_type:    Flaky" in shown.stdout
    assert "first_failure:" in shown.stdout and "failed_at:" in shown.stdout
    traceback_part = shown.stdout.split("traceback:\n", 1)[1]
    assert "Traceback (most recent call last)" in traceback_part
    first_frame = next(line for line in traceback_part.splitlines() if "File " in line)
    assert "tests/retry_tasks/flaky.py" in first_frame, traceback_part
    assert "tests.retry_tasks.flaky.Flaky: dead always fails (call 3)" in traceback_part

    missing = run_cli("failed", "show", "no-such-timer", "--url", redis_url)
    assert missing.returncode == 1
    assert "no failure recorded for no-such-timer" in missing.stderr

    # retry ID: due now, attempts from 1 again; it fails again after 3 more attempts
    retried = run_cli("failed", "retry", tid, "--url", redis_url)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == f"retrying {tid}"
    wait_until(lambda: len(calls_of(r, "dead")) == 6 and timers_client.failed()
               and settled(timers_client), 10, message="the retried timer to fail again")
    assert calls_of(r, "dead") == [1, 2, 3, 4, 5, 6]
    assert attempts_of(listener, tid)[3:] == [(1, "error"), (2, "error"), (3, "error")]
    (again,) = timers_client.failed()
    assert again.data["attempts"] == 3
    assert again.data["first_failure"] > d["failed_at"], "a fresh failure record"


def test_failed_retry_all_and_purge(timers_client: Timers, r: redis.Redis, listen,
                                    redis_url: str) -> None:
    listen()
    timers_client.schedule_many([TimerSpec("flaky.until_fixed", [tag], in_=0.05, id=tag)
                                 for tag in ("a", "b")])
    wait_until(lambda: len(timers_client.failed()) == 2 and settled(timers_client), 10,
               message="two failures")
    # a failure record from 8 days ago, as a listener of that time would have written it
    old_ms = redis_now_ms(r) - 8 * 86400 * 1000
    r.zadd(KEYS.failures, {"ancient": old_ms})
    r.hset(KEYS.failure_records, "ancient", json.dumps({
        "id": "ancient", "task": "flaky.until_fixed", "args": ["ancient"], "kind": "error",
        "error_type": "Flaky", "message": "long ago", "traceback": "", "attempts": 1,
        "first_failure": old_ms, "failed_at": old_ms}))
    assert set(failures_by_id(timers_client)) == {"a", "b", "ancient"}

    purged = run_cli("failed", "purge", "--older-than", "7d", "--url", redis_url)
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout.strip() == "purged 1 failure record(s)"
    assert set(failures_by_id(timers_client)) == {"a", "b"}

    r.set(FIXED, 1)
    retried = run_cli("failed", "retry", "--all", "--url", redis_url)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == "retrying 2 timer(s)"
    wait_until(lambda: len(done(r)) == 2 and settled(timers_client), 10,
               message="the retried timers to run")
    assert sorted(done(r)) == [["a", "ok"], ["b", "ok"]]
    assert timers_client.failed() == []

    r.delete(FIXED)
    timers_client.schedule_many([TimerSpec("flaky.until_fixed", [tag], in_=0.05, id=tag)
                                 for tag in ("c", "d", "e")])
    wait_until(lambda: len(timers_client.failed()) == 3 and settled(timers_client), 10,
               message="three new failures")
    kept = run_cli("failed", "purge", "--older-than", "7d", "--url", redis_url)
    assert kept.stdout.strip() == "purged 0 failure record(s)"
    everything = run_cli("failed", "purge", "--url", redis_url)
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.strip() == "purged 3 failure record(s)"
    assert timers_client.failed() == []
    listed = run_cli("failed", "list", "--url", redis_url)
    assert listed.stdout.strip() == "no failed timers"


def test_failed_retry_needs_an_id_or_all(redis_url: str) -> None:
    neither = run_cli("failed", "retry", "--url", redis_url)
    assert neither.returncode == 1
    assert "give a timer id or --all" in neither.stderr
    unknown = run_cli("failed", "retry", "nope", "--url", redis_url)
    assert unknown.returncode == 1
    assert "no failure recorded for nope" in unknown.stderr


def test_retry_does_not_overwrite_a_timer_rescheduled_meanwhile(
        timers_client: Timers, r: redis.Redis, listen) -> None:
    listener = listen()
    timers_client.schedule("flaky.fail_when_released", ["first"], in_=0, id="dup")
    wait_until(lambda: calls_of(r, "first") == [1], 10, message="the first run to start")

    # the user schedules the same id again while the first run is still going
    timers_client.schedule("ok.hit", ["newer"], in_=3, id="dup")
    r.set(RELEASE, 1)
    wait_until(lambda: attempts_of(listener, "dup") == [(1, "error")], 10,
               message="the first run to fail")
    wait_until(lambda: timers_client.stats().running == 0, 5, message="its ending written")
    pending = timers_client.get("dup")
    assert pending is not None
    assert (pending.task, pending.args, pending.attempts) == ("ok.hit", ["newer"], 0)

    wait_until(lambda: done(r) == [["newer", "ok"]] and settled(timers_client), 10,
               message="the newer schedule to fire")
    assert calls_of(r, "first") == [1], "the failed run was not retried"
    assert attempts_of(listener, "dup") == [(1, "error"), (1, "ok")]
    assert timers_client.failed() == []
    counters = timers_client.stats().counters
    assert counters.get("retried", 0) == 0
    assert counters.get("fired") == 1


def test_a_timer_deep_into_its_retries_is_retried_at_the_capped_delay(
        timers_client: Timers, r: redis.Redis, listen) -> None:
    """``@task(retries=5000)`` with the default Backoff (1 s doubling, capped at 1 h): the
    1101st attempt fails and is retried within the hour; the run must not stay running."""
    listener = listen()
    spec = TimerSpec("flaky.keeps_trying", ["deep"], in_=0.05, id="deep")
    timers_client.run(timers_client.ops.schedule(spec, {"a": "1100"}))  # 1100 failures so far
    try:
        wait_until(lambda: calls_of(r, "deep") == [1], 10, message="attempt 1101 to run")

        def retried() -> bool:
            pending = timers_client.get("deep")
            return pending is not None and timers_client.stats().running == 0

        wait_until(retried, 5, message="attempt 1101 to end (retried) instead of hanging")
        pending = timers_client.get("deep")
        assert pending is not None and pending.attempts == 1101
        seconds_left = pending.seconds_left(redis_now(r))
        assert 1700 < seconds_left <= 3600
        assert attempts_of(listener, "deep") == [(1101, "error")]
        assert timers_client.stats().counters.get("retried") == 1
    finally:
        # Should the listener's task die of an exception nobody retrieves, asyncio logs it
        # when the task is garbage collected; let that happen now, not inside some later
        # ast.parse (CPython 3.11 then fails with "AST constructor recursion depth mismatch").
        listener.stop()
        gc.collect()


# -- max_lateness -----------------------------------------------------------------------


def test_max_lateness_of_a_timer_and_of_a_task(timers_client: Timers, r: redis.Redis,
                                               listen) -> None:
    listener = listen()
    past = redis_now(r) - timedelta(seconds=10)
    timers_client.schedule_many([
        # per timer: 10 s late with a 1 s limit is missed, with a 60 s limit it runs
        TimerSpec("ok.hit", ["too-late"], at=past, id="too-late", max_lateness=1),
        TimerSpec("ok.hit", ["in-time"], at=past, id="in-time", max_lateness=60),
        TimerSpec("ok.hit", ["no-limit"], at=past, id="no-limit"),
        # per task (5 s): applies when the timer has no limit of its own
        TimerSpec("late.limited", ["task-late"], at=past, id="task-late"),
        TimerSpec("late.limited", ["task-on-time"], in_=0.05, id="task-on-time"),
        # the timer's own limit beats the task's
        TimerSpec("late.limited", ["timer-wins"], at=past, id="timer-wins", max_lateness=60),
    ])
    wait_until(lambda: len(listener.reports()) == 6 and settled(timers_client), 10,
               message="six runs")

    outcomes = {f.timer_id: f.outcome.kind for f in listener.reports()}
    assert outcomes == {"too-late": "missed", "in-time": "ok", "no-limit": "ok",
                        "task-late": "missed", "task-on-time": "ok", "timer-wins": "ok"}
    assert sorted(t for t, _ in calls(r)) == ["in-time", "no-limit", "task-on-time",
                                              "timer-wins"], "a missed timer does not run"
    failures = failures_by_id(timers_client)
    assert set(failures) == {"too-late", "task-late"}
    for tid, limit in (("too-late", 1), ("task-late", TASK_MAX_LATENESS)):
        d = failures[tid]
        assert (d["kind"], d["error_type"], d["attempts"]) == ("missed", "Missed", 1)
        assert f"over its max lateness of {limit:g} s: not run" in str(d["message"])
    counters = timers_client.stats().counters
    assert counters.get("retried", 0) == 0
    assert counters.get("failed") == 2


@pytest.fixture
def default_timers(redis_url: str) -> Iterator[None]:
    """The module-level ``timers.schedule`` pointed at the test server, then put back."""
    saved = timers._default
    timers._default = None
    timers.configure(redis_url)
    yield
    if timers._default is not None:
        timers._default.close()
    timers._default = saved


def test_module_level_schedule_takes_max_lateness_as_the_tasks_guide_shows(
        default_timers: None, timers_client: Timers, r: redis.Redis, listen) -> None:
    """docs/guides/tasks.md: ``timers.schedule("reminders.good_morning", [42], at=eight_am,
    max_lateness=1800)``."""
    listener = listen()
    past = redis_now(r) - timedelta(seconds=10)
    tid = timers.schedule("ok.hit", ["module-level"], at=past, max_lateness=1)
    wait_until(lambda: listener.reports() and settled(timers_client), 10, message="a run")
    assert [(f.timer_id, f.outcome.kind) for f in listener.reports()] == [(tid, "missed")]
    assert calls(r) == []


# -- timeouts ---------------------------------------------------------------------------


def test_async_task_over_its_timeout_is_cancelled_and_recorded_as_timeout_error(
        timers_client: Timers, r: redis.Redis, listen) -> None:
    listener = listen()
    timers_client.schedule("slow.sleepy", ["sleepy"], in_=0.05, id="sleepy")
    wait_until(lambda: timers_client.failed() and settled(timers_client), 10,
               message="the timeout to be recorded")
    (failure,) = timers_client.failed()
    d = failure.data
    assert (failure.timer_id, d["kind"], d["error_type"], d["attempts"]) == (
        "sleepy", "error", "TimeoutError", 1)
    assert f"within {TIMEOUT} s" in str(d["message"])
    assert calls_of(r, "sleepy") == [1]
    assert attempts_of(listener, "sleepy") == [(1, "error")]
    (report,) = listener.reports()
    assert report.outcome.error_type == "TimeoutError"
    assert done(r) == [["sleepy", "cancelled"]], "the coroutine was cancelled at its timeout"


def test_async_task_over_its_timeout_is_retried_when_it_has_retries(
        timers_client: Timers, r: redis.Redis, listen) -> None:
    listener = listen()
    timers_client.schedule("slow.sleepy_retried", ["sleepy2"], in_=0.05, id="sleepy2")
    wait_until(lambda: timers_client.failed() and settled(timers_client), 10,
               message="the second timeout to be recorded")
    assert calls_of(r, "sleepy2") == [1, 2]
    assert attempts_of(listener, "sleepy2") == [(1, "error"), (2, "error")]
    (failure,) = timers_client.failed()
    assert (failure.data["error_type"], failure.data["attempts"]) == ("TimeoutError", 2)
    assert timers_client.stats().counters.get("retried") == 1
    assert done(r) == [["sleepy2", "cancelled"], ["sleepy2", "cancelled"]]


def test_plain_function_over_its_timeout_is_recorded_and_finishes_in_its_thread(
        timers_client: Timers, r: redis.Redis, listen) -> None:
    listener = listen()
    timers_client.schedule("slow.overrun", ["overrun"], in_=0.05, id="overrun")
    wait_until(lambda: timers_client.failed() and settled(timers_client), 10,
               message="the timeout to be recorded")
    (failure,) = timers_client.failed()
    assert (failure.data["error_type"], failure.data["attempts"]) == ("TimeoutError", 1)
    assert done(r) == [], "still running in its thread"
    # the listener carries on while the thread still runs
    timers_client.schedule("ok.hit", ["meanwhile"], in_=0.05)
    wait_until(lambda: done(r) == [["meanwhile", "ok"]], 10, message="another timer to fire")
    r.set(RELEASE, 1)
    wait_until(lambda: ["overrun", "released"] in done(r), 10,
               message="the function to return in its thread")
    assert Counter(t for t, _ in calls(r)) == Counter({"overrun": 1, "meanwhile": 1})
    assert [f.outcome.kind for f in listener.reports()] == ["error", "ok"]
