"""Flow control through a Redis restart: the key queues, slots and parked timers are Redis
data like any other, so a restart with persistence mid-run loses none of them and a device
still never runs two commands at once.

The listeners use a server of their own, stopped (data kept) and started again on the same
port while commands run and wait; the tasks record what they saw on the session's server,
which stays up, so their own bookkeeping is not part of the outage.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import KEYS, TASKS, Processes, runs, settled
from tests.integration.test_flow import listeners, overlaps
from tests.task_pkg import STARTED
from tests.task_pkg.flow import ACTIVE
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

DEVICES = 15
COMMANDS = 300  # 20 per device, 50 ms each: a second of work per device


def running_commands(r: redis.Redis) -> int:
    """Commands inside the task now, by their own per-device counters (``flow.ACTIVE``)."""
    keys = r.keys(ACTIVE + "*")
    return sum(int(n or 0) for n in r.mget(keys)) if keys else 0


def test_device_commands_survive_a_redis_restart_mid_run_one_at_a_time(
        own_server: EmbeddedServer, r: redis.Redis, processes: Processes) -> None:
    url = own_server.url
    broker = redis.Redis.from_url(url, decode_responses=True)
    assert broker.config_get("appendonly") == {"appendonly": "yes"}
    procs = listeners(processes, url, 3, "--tasks", TASKS)
    wait_until(lambda: broker.zcard(KEYS.listeners) >= 3, 20,
               message="3 listeners to start")
    with Timers(url) as t:
        t.schedule_many(TimerSpec("flow.device_command", [f"c{i}", i % DEVICES, 0.05],
                                  id=f"c{i}", in_=0.5) for i in range(COMMANDS))
    wait_until(lambda: r.llen(STARTED) >= 60, 20, message="60 commands to start")
    waiting = broker.zcard(KEYS.key_queue("device:0"))
    own_server.stop(keep_data=True)
    # the outage lasts until every listener lost its connection (it retries) and every
    # command running at the stop has ended (they count themselves on the suite's server)
    wait_until(lambda: all("connection to Redis lost" in processes.output(p) for p in procs),
               20, message="every listener to lose its connection")
    wait_until(lambda: running_commands(r) == 0, 20,
               message="the commands running at the stop to end")
    own_server.start()
    assert own_server.url == url, "the server came back on another port"

    wait_until(lambda: len({run[0] for run in runs(r)}) >= COMMANDS, 60,
               message="every command to run after the restart")
    for p in procs:
        assert p.poll() is None, processes.output(p)
    done = runs(r)
    counts = Counter(run[0] for run in done)
    assert set(counts) == {f"c{i}" for i in range(COMMANDS)}
    twice = sorted(tag for tag, n in counts.items() if n > 1)
    # only a command in flight when the server stopped may run again (its lease lapsed
    # while its ending could not be written): at most one per device
    assert len(twice) <= DEVICES, twice
    assert max(run[5] for run in done) == 1, "two commands ran at once on one device"
    assert overlaps(done) == 1
    with Timers(url) as t:
        wait_until(lambda: settled(t), 20, message="nothing pending, waiting or running")
        assert t.stats().failed == 0
    assert broker.keys(KEYS.key_queue("*")) == [], "a key queue was left behind"
    assert broker.hlen(KEYS.parked) == 0
    started = [json.loads(x) for x in r.lrange(STARTED, 0, -1)]
    print(f"\nrestart mid-run: {waiting} commands of device 0 were waiting at the stop; "
          f"{len(started)} starts for {COMMANDS} commands, {len(twice)} ran twice")
    broker.close()
