"""Timers fire through the real ``expired`` event as well as through the sweeper.

The due-driven sweeper wakes at each due time, so on an idle server it usually claims a
timer before Redis gets round to deleting the key and publishing ``expired``. To see the
event path on its own, these tests keep the listener's one task slot busy with a slow task:
a listener with no free slot claims nothing, while its event loop keeps queueing the ids
that ``expired`` events name. When the slot frees, the next claim takes the queued ids
first, so the timer is claimed because of the event (source ``event``).
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import (
    KEYS,
    lateness_line,
    redis_now_ms,
    run_counts,
    runs,
    settled,
    started,
)
from tests.task_pkg.slow import RELEASE
from timers import Timers, TimerSpec
from timers.model.encoding import Record, entry_text, escape_id

pytestmark = pytest.mark.integration


def test_two_hundred_timers_each_fire_once(timers_client: Timers, r: redis.Redis,
                                           start_listener) -> None:
    listener = start_listener()
    ids = [f"t{i}" for i in range(200)]
    timers_client.schedule_many(
        TimerSpec("record.hit", [tid], in_=0.3 + 1.7 * i / 199, id=tid)
        for i, tid in enumerate(ids)
    )

    wait_until(lambda: len(run_counts(r)) == 200 and settled(timers_client), 15,
               message="all 200 timers to fire")

    assert run_counts(r) == Counter({tid: 1 for tid in ids})
    reports = listener.reports()
    assert sorted(f.timer_id for f in reports) == sorted(ids)
    assert all(f.outcome.ok and f.attempt == 1 for f in reports)
    assert {f.source for f in reports} <= {"event", "sweep"}
    stats = timers_client.stats()
    assert stats.fired == 200 and stats.failed == 0 and stats.counters.get("reruns", 0) == 0
    print(lateness_line("200 timers over 0.3-2 s, events on", reports))


def _occupy_single_slot(timers_client: Timers, r: redis.Redis, start_listener):
    """A listener with one task slot, held by a slow task until ``test:release`` is set."""
    listener = start_listener(concurrency=1)
    timers_client.schedule("slow.block", ["busy"], in_=0, id="busy")
    wait_until(lambda: started(r) == ["busy"], 10, message="the slow task to start")
    return listener


def test_expired_event_claims_timer_while_sweeper_cannot(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = _occupy_single_slot(timers_client, r, start_listener)

    timers_client.schedule("record.hit", ["by-event"], in_=0.05, id="by-event")
    key = KEYS.timer_key(entry_text("by-event", Record("record.hit", ["by-event"]).encode()))
    assert r.exists(key)
    wait_until(lambda: not r.exists(key), 10,
               message="Redis to expire the timer key (and publish `expired`)")
    assert run_counts(r) == Counter(), "nothing may run while the only slot is busy"

    r.set(RELEASE, 1)
    wait_until(lambda: run_counts(r) == Counter({"busy": 1, "by-event": 1}), 10,
               message="the evented timer to fire once the slot is free")
    wait_until(lambda: settled(timers_client), 10, message="the runs to finish")

    report = next(f for f in listener.reports() if f.timer_id == "by-event")
    assert report.source == "event"
    assert report.outcome.ok and report.attempt == 1


def _raw_pending(r: redis.Redis, timer_id: str, record: Record, due_ms: int) -> str:
    """Write a pending timer the way schedule.lua does, minus its key and its wake message.

    Returns the key name an ``expired`` event for it would carry.
    """
    escaped = escape_id(timer_id)
    text = record.encode()
    r.hset(KEYS.records, escaped, text)
    r.zadd(KEYS.due, {escaped: due_ms})
    return KEYS.timer_key(entry_text(escaped, text))


def test_published_expired_event_runs_the_stored_record_only(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    """A hand-published ``expired`` event for a due timer triggers its claim (source
    event); what runs is the stored record, never the args in the event's key name; an
    event for a timer that is not pending runs nothing."""
    listener = _occupy_single_slot(timers_client, r, start_listener)
    now = redis_now_ms(r)
    real_key = _raw_pending(r, "pub:1", Record("record.hit", ["stored args"]), now - 5)
    forged_key = KEYS.timer_key(entry_text(escape_id("pub:1"),
                                           Record("record.hit", ["forged args"]).encode()))
    ghost_key = KEYS.timer_key(entry_text("ghost", Record("record.hit", ["ghost"]).encode()))
    channel = KEYS.expired_channel(0)

    assert r.publish(channel, forged_key) == 1  # the listener is the one subscriber
    assert r.publish(channel, ghost_key) == 1
    assert r.publish(channel, real_key) == 1
    r.set(RELEASE, 1)

    wait_until(lambda: len(runs(r)) == 2 and settled(timers_client), 10,
               message="the published timer to fire")
    assert runs(r) == [["busy", "released"], ["stored args"]]
    report = next(f for f in listener.reports() if f.timer_id == "pub:1")
    assert report.source == "event"
    assert report.due_ms == now - 5
    assert timers_client.failed() == []
    assert timers_client.stats().counters.get("rejected", 0) == 0
