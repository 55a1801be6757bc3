"""Bad timers are recorded where ``Timers.failed()`` (and ``timers failed``) lists them, and
the listener keeps firing the timers that come after them."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import KEYS, redis_now_ms, run_counts, settled
from timers import Timers, TimerSpec

pytestmark = pytest.mark.integration


def test_failing_unknown_bad_args_and_malformed_timers_are_recorded_and_others_fire(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    timers_client.schedule_many([
        TimerSpec("fail.boom", ["x"], in_=0.2, id="raises"),
        TimerSpec("nosuch.task", [1], in_=0.2, id="unknown"),
        TimerSpec("record.hit", {"nope": 1}, in_=0.2, id="bad-args"),
        TimerSpec("record.hit", ["before"], in_=0.1, id="before"),
    ])
    # a record that does not decode (written by hand: the API refuses to write one)
    broken = "record.hit:[\"unterminated"
    r.hset(KEYS.records, "broken", broken)
    r.zadd(KEYS.due, {"broken": redis_now_ms(r) + 200})
    # an expired event for a key that names no timer at all
    garbage_key = KEYS.timer_key("no-record-here")
    assert r.publish(KEYS.expired_channel(0), garbage_key) == 1

    wait_until(lambda: len(timers_client.failed()) == 5 and settled(timers_client), 10,
               message="the five failures to be recorded")
    after = [f"after{i}" for i in range(20)]
    timers_client.schedule_many(
        TimerSpec("record.ahit" if i % 2 else "record.hit", [tid], in_=0.05 + 0.01 * i, id=tid)
        for i, tid in enumerate(after)
    )
    wait_until(lambda: len(run_counts(r)) == 21 and settled(timers_client), 10,
               message="the timers after the failures to fire")

    assert run_counts(r) == Counter({tid: 1 for tid in ["before", *after]})
    failures = {f.data.get("id") or f.data.get("key"): f.data for f in timers_client.failed()}
    assert set(failures) == {"raises", "unknown", "bad-args", "broken", garbage_key}
    raised = failures["raises"]
    assert (raised["kind"], raised["error_type"], raised["message"]) == (
        "error", "TaskBroke", "boom x")
    assert "raise TaskBroke" in raised["traceback"]
    assert raised["task"] == "fail.boom" and raised["args"] == ["x"]
    assert raised["attempts"] == 1
    assert failures["unknown"]["kind"] == "refused"
    assert "nosuch" in failures["unknown"]["message"]
    assert failures["bad-args"]["kind"] == "bad_args"
    assert "nope" in failures["bad-args"]["message"]
    assert failures["broken"]["kind"] == "malformed"
    assert failures[garbage_key]["kind"] == "rejected"
    assert failures[garbage_key]["id"] is None

    stats = timers_client.stats()
    assert stats.failed == 5
    assert stats.counters.get("fired") == 21
    assert stats.counters.get("failed") == 4
    outcomes = {f.timer_id: f.outcome.kind for f in listener.reports()}
    assert outcomes["raises"] == "error" and outcomes["after19"] == "ok"
