"""A full server (``maxmemory`` reached, ``noeviction``) while timers wait for a
concurrency key: none is lost, none runs beside another of its key, and all run once
memory frees (holding a timer back needs memory; freeing a slot does not)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, ListenerThread, runs
from tests.integration.test_full_memory import fill, full_url
from tests.task_pkg import STARTED
from tests.task_pkg.slow import RELEASE
from timers import Timers, TimerSpec
from timers.model.keys import Keyspace

pytestmark = [pytest.mark.integration, pytest.mark.one_server]
KEYS = Keyspace()
__all__ = ["full_url"]  # the fixture


def test_waiting_timers_survive_a_full_server_and_run_one_at_a_time_after(
        full_url: str, r: redis.Redis,
        start_listener: Callable[..., ListenerThread]) -> None:
    full = redis.Redis.from_url(full_url)
    start_listener(url=full_url, tasks=TASKS, lease=1.0)
    with Timers(full_url) as t:
        t.schedule("flow.keyed", ["holder", "k", -1], in_=0, key="k", id="holder")
        wait_until(lambda: r.llen(STARTED) == 1, 10, message="the holder to start")
        t.schedule_many(TimerSpec("flow.keyed", [f"w{i}", "k"], id=f"w{i}", in_=0, key="k")
                        for i in range(5))
        wait_until(lambda: full.zcard(KEYS.key_queue("k")) == 5, 10,
                   message="five timers to wait for the key")
        fill(full)
        r.set(RELEASE, 1)  # the holder ends on a full server: its slot goes to the next
        wait_until(lambda: len(runs(r)) >= 2, 15, message="the holder's ending to be written")
        full.delete(*full.keys("fill:*"))
        full.config_set("maxmemory", 0)
        wait_until(lambda: len(runs(r)) == 6, 20, message="every waiting timer to run")
        assert t.stats().failed == 0 and t.stats().pending == 0
    done = runs(r)
    assert sorted(run[0] for run in done) == ["holder"] + [f"w{i}" for i in range(5)]
    spans = sorted((run[3], run[4]) for run in done)  # the holder's start reads 0
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans
    assert max(run[5] for run in done) == 1
