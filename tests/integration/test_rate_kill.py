"""A rate limit through a ``kill -9`` of Redis (invariant 13, finding 4 of issue 28): the
starts that follow the restart come an interval after the last start before the kill, even
when the server came back without its last writes, the rate's time among them.

Which writes a kill loses depends on persistence. With AOF (``appendfsync everysec``) Redis
hands each write to the kernel before it replies, so a killed process loses nothing it
acknowledged (only a crash of the machine loses up to the last second or two); with RDB
snapshots alone it loses everything since the last snapshot. Both are run here: ``aof``,
and ``snapshot``, where a ``SAVE`` taken a second of starts before the kill stands for a
server that lost that second (as a machine crash with ``everysec`` would).

The listeners use a server of their own. The timers are scheduled (and saved) well before
the kill; the server is killed the moment a start is seen, and started again on the same
port and data. The starts are the gate's own, on the Redis clock (every ``last`` it
writes, read off ``MONITOR``: :class:`RateStarts`): the time a task reads on entry adds the
listener's dispatch to every gap (±15 ms on a loaded 2-core machine, below the interval
less its 5 ms of jitter with no rate at fault), and a task that reads ``last`` may find
the next start's (its run handed back across the kill, say). Before the fix, with
``snapshot``, the first start after the restart came about 100 to 300 ms after the last
start before the kill, at a 500 ms interval.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import KEYS, TASKS, Processes, settled
from tests.integration.rate_starts import RateStarts
from tests.integration.test_flow import listeners
from tests.task_pkg import RUNS
from tests.task_pkg.flow import RATE_URL_ENV
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.flow.names import TASK_KEY

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TIMERS = 12
TASK = "flow.paced_on_redis_clock"
INTERVAL_MS = 500  # tests.task_pkg.flow.paced_on_redis_clock: 120/m
JITTER_MS = 5  # gate.lua RATE_JITTER_MS: how much closer than its interval a start may come


@pytest.fixture(params=["aof", "snapshot"])
def killed_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """A server of the test's own: AOF ``everysec`` (the repository's redis.conf), or RDB
    snapshots only."""
    extra = ("--appendonly", "no") if request.param == "snapshot" else ()
    server = EmbeddedServer(config=ROOT / "redis.conf", extra_args=extra).start()
    try:
        yield server
    finally:
        server.stop()


def starts(r: redis.Redis) -> list[tuple[str, float]]:
    """``(tag, start ms on the Redis clock)`` of every run so far."""
    return [(tag, at) for tag, at in (json.loads(x) for x in r.lrange(RUNS, 0, -1))]


def test_a_rate_limit_keeps_its_interval_through_a_kill_of_redis(
        killed_server: EmbeddedServer, r: redis.Redis, processes: Processes) -> None:
    url = killed_server.url
    broker = redis.Redis.from_url(url)
    env = processes.env() | {RATE_URL_ENV: url}
    procs = listeners(processes, url, 2, "--tasks", TASKS, env=env)
    wait_until(lambda: broker.zcard(KEYS.listeners) >= 2, 20, message="2 listeners")
    with RateStarts(url, KEYS.rate(TASK_KEY + TASK)) as gate_starts:
        with Timers(url) as t:
            t.schedule_many(TimerSpec(TASK, [f"p{i}"], id=f"p{i}", in_=0.2)
                            for i in range(TIMERS))
        wait_until(lambda: r.llen(RUNS) >= 3, 20, message="3 starts (the schedule synced since)")
        broker.save()  # the snapshot the "snapshot" server comes back with
        wait_until(lambda: r.llen(RUNS) >= 5, 20, message="2 starts more")
        seen = r.llen(RUNS)
        wait_until(lambda: r.llen(RUNS) > seen, 5, interval=0.001, message="the next start")
        pid = killed_server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed_server.stop(keep_data=True)  # reaps the killed process; the data stays
        killed_server.start()
        assert killed_server.url == url, "the server came back on another port"
        wait_until(lambda: len({tag for tag, _ in starts(r)}) == TIMERS, 60,
                   message="every timer to run after the restart")
        with Timers(url) as t:  # a timer whose run the server forgot runs again: wait for it
            wait_until(lambda: settled(t), 30, message="nothing pending or running")
    for p in procs:
        assert p.poll() is None, processes.output(p)
    assert len(gate_starts.times()) >= len(starts(r)), (gate_starts.times(), starts(r))
    gaps = gate_starts.gaps()
    by_tasks = [round(b - a, 1) for a, b in itertools.pairwise(sorted(at for _, at in starts(r)))]
    print(f"smallest gap on the gate's clock {min(gaps)} ms "
          f"(by the rate's last as the tasks read it {min(by_tasks)} ms)")
    assert min(gaps) >= INTERVAL_MS - JITTER_MS, (gaps, starts(r))
