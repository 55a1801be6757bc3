"""A rate limit through a Redis restart (invariant 13): its starts stay an interval apart
when the server stops mid-run and comes back with its data (AOF), as they do without one.

The listeners use a server of their own, stopped (data kept) and started again on the same
port while timers wait for the rate. The starts are the gate's own, on the Redis clock
(every ``last`` it writes, read off ``MONITOR``: :class:`RateStarts`; the time a task reads
on entry adds the listener's dispatch, tens of ms on a loaded 2-core machine, and a task
that reads ``last`` may find the next start's), so the bound is the interval less the
gate's 5 ms of jitter. A rate that forgot itself across the restart gave starts 5 ms
apart."""

from __future__ import annotations

import itertools
import json
import time

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import KEYS, TASKS, Processes
from tests.integration.rate_starts import RateStarts
from tests.integration.test_flow import listeners
from tests.task_pkg import RUNS
from tests.task_pkg.flow import RATE_URL_ENV
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.flow.names import TASK_KEY

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TIMERS = 16
TASK = "flow.paced_on_redis_clock"  # 120/m
INTERVAL_MS = 500
JITTER_MS = 5  # gate.lua RATE_JITTER_MS: how much closer than its interval a start may come
OUTAGE = 2 * INTERVAL_MS / 1000
"""Seconds the server stays down (the scenario's own length, not a wait for an outcome):
two of the rate's intervals, so slots fall due while it is away."""


def test_a_rate_limit_keeps_its_interval_through_a_redis_restart(
        own_server: EmbeddedServer, r: redis.Redis, processes: Processes) -> None:
    url = own_server.url
    broker = redis.Redis.from_url(url)
    env = processes.env() | {RATE_URL_ENV: url}
    procs = listeners(processes, url, 2, "--tasks", TASKS, env=env)
    wait_until(lambda: broker.zcard(KEYS.listeners) >= 2, 20, message="2 listeners")
    with RateStarts(url, KEYS.rate(TASK_KEY + TASK)) as gate_starts:
        with Timers(url) as t:
            t.schedule_many(TimerSpec(TASK, [f"p{i}"], id=f"p{i}", in_=0.2)
                            for i in range(TIMERS))
        wait_until(lambda: r.llen(RUNS) >= 4, 20, message="4 starts")
        own_server.stop(keep_data=True)
        time.sleep(OUTAGE)
        wait_until(lambda: all("connection to Redis lost" in processes.output(p)
                               for p in procs), 20, message="every listener to see the outage")
        own_server.start()
        assert own_server.url == url, "the server came back on another port"
        wait_until(lambda: len({json.loads(x)[0] for x in r.lrange(RUNS, 0, -1)}) >= TIMERS,
                   60, message="every timer to run after the restart")
    for p in procs:
        assert p.poll() is None, processes.output(p)
    runs = r.llen(RUNS)
    assert len(gate_starts.times()) >= runs, (gate_starts.times(), runs)
    gaps = gate_starts.gaps()
    by_tasks = [round(b - a, 1) for a, b in itertools.pairwise(
        sorted(json.loads(x)[1] for x in r.lrange(RUNS, 0, -1)))]
    print(f"smallest gap on the gate's clock {min(gaps)} ms "
          f"(by the rate's last as the tasks read it {min(by_tasks)} ms)")
    assert min(gaps) >= INTERVAL_MS - JITTER_MS, gaps
