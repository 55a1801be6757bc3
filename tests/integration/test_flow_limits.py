"""Limits that combine, on a real server with real listener processes: a rate with a
concurrency cap spaces its starts as the rate alone does (invariant 13), however long its
timers waited for the cap. What ran and when is what the tasks wrote (tests/task_pkg/flow.py)."""

from __future__ import annotations

import json

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, Processes, runs, settled
from tests.integration.test_flow import listeners, wait_listening
from tests.task_pkg import STARTED
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TIMERS = 30  # 2 to 3.9 s each: the cap binds as often as the rate


def test_a_rate_with_a_concurrency_cap_never_bunches(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    procs = listeners(processes, redis_url, 2, "--tasks", TASKS, "--processes", "2")
    wait_listening(r, 4, procs, processes)
    with Timers(redis_url) as t:
        t.schedule_many(TimerSpec("flow.capped_and_paced", [f"t{i}", 2 + (i * 7 % 20) / 10],
                                  in_=0.2) for i in range(TIMERS))
        wait_until(lambda: len(runs(r)) == TIMERS, 90, message="every timer to run")
        wait_until(lambda: settled(t), 20, message="nothing pending or running")
    starts = sorted(json.loads(s)[3] for s in r.lrange(STARTED, 0, -1))
    assert len(starts) == TIMERS
    # 120/m: one start every 500 ms, so never more than 2 (3 with a few ms of jitter at
    # the window's edges) in any second; the cap of 5 at once holds too
    busiest = max(sum(1 for s in starts if first <= s < first + 1000) for first in starts)
    assert busiest <= 3, starts
    assert max(run[5] for run in runs(r)) <= 5
