"""Several listeners race for the same timers; each timer still runs exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import lateness_line, run_counts, settled
from timers import Timers, TimerSpec

pytestmark = pytest.mark.integration


def test_two_listeners_run_each_of_400_timers_exactly_once(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    first = start_listener()
    second = start_listener()
    ids = [f"m{i}" for i in range(400)]
    timers_client.schedule_many(
        TimerSpec("record.hit", [tid], in_=0.2 + 1.8 * i / 399, id=tid)
        for i, tid in enumerate(ids)
    )

    wait_until(lambda: len(run_counts(r)) == 400 and settled(timers_client), 20,
               message="all 400 timers to fire")

    counts = run_counts(r)
    duplicates = {tid: n for tid, n in counts.items() if n != 1}
    assert duplicates == {}, f"timers run more than once: {duplicates}"
    assert set(counts) == set(ids)
    reports = first.reports() + second.reports()
    assert Counter(f.timer_id for f in reports) == Counter({tid: 1 for tid in ids})
    stats = timers_client.stats()
    assert stats.fired == 400
    assert stats.counters.get("reruns", 0) == 0
    assert stats.counters.get("late_finishes", 0) == 0
    print(lateness_line(f"400 timers, 2 listeners ({len(first.reports())}/"
                        f"{len(second.reports())} runs each)", reports))
