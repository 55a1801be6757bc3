"""With keyspace notifications off, timers still fire, all of them through the sweeper.

A listener with events on rarely needs them: it claims each timer a few ms before it is due
and deletes its key, so the key never expires. So "every run came from the sweep" proves
nothing by itself. The contrast test below builds the case where events do the work: the
only task slot is busy while timers come due, so their keys expire and, with events on,
the expired events name them to the next claim. With events off the same runs must come
from the sweep, and all of them still run once.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import KEYS, lateness_line, run_counts, settled, started
from tests.task_pkg.slow import RELEASE
from timers import Timers, TimerSpec

pytestmark = pytest.mark.integration


def test_timers_fire_by_sweep_alone_and_listener_says_how_to_enable_events(
        timers_client: Timers, r: redis.Redis, start_listener,
        caplog: pytest.LogCaptureFixture) -> None:
    r.config_set("notify-keyspace-events", "")  # the redis_url fixture restores Ex
    with caplog.at_level(logging.WARNING, logger="timers"):
        listener = start_listener()
        ids = [f"q{i}" for i in range(200)]
        timers_client.schedule_many(
            TimerSpec("record.hit", [tid], in_=0.2 + 1.8 * i / 199, id=tid)
            for i, tid in enumerate(ids)
        )
        wait_until(lambda: len(run_counts(r)) == 200 and settled(timers_client), 15,
                   message="all 200 timers to fire without events")

    assert run_counts(r) == Counter({tid: 1 for tid in ids})
    reports = listener.reports()
    assert sorted(f.timer_id for f in reports) == sorted(ids)
    warnings = [rec.getMessage() for rec in caplog.records
                if rec.name.startswith("timers") and rec.levelno >= logging.WARNING]
    assert any("notify-keyspace-events" in w and "Ex" in w and "CONFIG SET" in w
               for w in warnings), warnings
    print(lateness_line("200 timers over 0.2-2 s, events off", reports))


def _timer_keys_left(r: redis.Redis, prefix: str) -> list[str]:
    return list(r.scan_iter(match=f"{KEYS.timer_key_start}{prefix}*", count=1000))


@pytest.mark.parametrize(("events", "source"), [("Ex", "event"), ("", "sweep")])
def test_timers_due_while_the_listener_is_busy_are_found_by_events_or_else_by_the_sweep(
        timers_client: Timers, r: redis.Redis, start_listener, events: str,
        source: str) -> None:
    r.config_set("notify-keyspace-events", events)  # the redis_url fixture restores Ex
    listener = start_listener(concurrency=1)
    timers_client.schedule("slow.block", ["blocker"], in_=0, id="blocker")
    wait_until(lambda: started(r) == ["blocker"], 10, message="the blocker to hold the slot")
    ids = [f"w{i}" for i in range(10)]
    timers_client.schedule_many(
        TimerSpec("record.hit", [tid], in_=0.05 + 0.01 * i, id=tid)
        for i, tid in enumerate(ids))
    # the slot is busy, so no claim takes them: their keys expire (and send events if on)
    wait_until(lambda: not _timer_keys_left(r, "w"), 10,
               message="the waiting timers' keys to expire")
    r.set(RELEASE, "1")

    wait_until(lambda: len(run_counts(r)) == 11 and settled(timers_client), 10,
               message="the blocker and the 10 waiting timers to run")
    assert run_counts(r) == Counter({"blocker": 1, **{tid: 1 for tid in ids}})
    found_by = {f.timer_id: f.source for f in listener.reports() if f.timer_id in ids}
    assert found_by == {tid: source for tid in ids}
