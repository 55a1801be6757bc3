"""With keyspace notifications off, timers still fire, all of them through the sweeper."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import lateness_line, run_counts, settled
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
    assert {f.source for f in reports} == {"sweep"}
    warnings = [rec.getMessage() for rec in caplog.records
                if rec.name.startswith("timers") and rec.levelno >= logging.WARNING]
    assert any("notify-keyspace-events" in w and "Ex" in w and "CONFIG SET" in w
               for w in warnings), warnings
    print(lateness_line("200 timers over 0.2-2 s, events off", reports))
