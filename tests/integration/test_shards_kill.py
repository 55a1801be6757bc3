"""A sharded prefix on a real server when a listener dies: each shard is swept first by
one listener, the others are backups 20 ms behind, so a ``kill -9`` of one listener leaves
nothing unswept (a cluster only spreads the same shards over nodes)."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes, runs, settled
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_a_killed_listeners_shards_fire_through_the_others(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    with Timers(redis_url, shards=4) as t:
        t.stats()  # fixes the layout: 4 shards
        procs = [processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks",
                                 "tests.task_pkg", "--lease", "2") for _ in range(2)]
        wait_until(lambda: len(t.listeners()) >= 2, 20, message="2 listeners to start")
        t.schedule_many(TimerSpec("record.hit", [f"k{i}"], id=f"k{i}", in_=1 + 4 * i / 2000)
                        for i in range(2000))
        wait_until(lambda: r.llen("test:runs") >= 500, 20, message="some timers to fire")
        os.kill(procs[0].pid, signal.SIGKILL)
        wait_until(lambda: len({run[0] for run in runs(r)}) >= 2000, 20,
                   message="every timer to fire after the kill")
        wait_until(lambda: settled(t), 20, message="nothing pending or running")
        reruns = t.stats().counters.get("reruns", 0)
    fired = Counter(run[0] for run in runs(r))
    assert set(fired) == {f"k{i}" for i in range(2000)}
    twice = sum(n - 1 for n in fired.values() if n > 1)
    assert twice <= reruns, "a timer ran twice without its rerun being counted"
    assert procs[1].poll() is None, processes.output(procs[1])
