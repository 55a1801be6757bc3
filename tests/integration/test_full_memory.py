"""A full Redis (``maxmemory`` reached, ``noeviction``) with tasks longer than the lease.

Before: renewals were refused (OOM) while claims went through, so every lease lapsed and
the listener ran each timer again (10 timers, 40 starts); renewal failures were logged at
DEBUG. Now claims stop, leases are kept, the listener says so once, and claims resume when
memory frees.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import ListenerThread
from tests.retry_tasks import RELEASE, calls, done
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.keys import Keyspace

pytestmark = pytest.mark.integration

LEASE = 0.6
KEYS = Keyspace()


@pytest.fixture
def full_url() -> Iterator[str]:
    """A server of its own (redis.conf: noeviction) that the test fills up."""
    with EmbeddedServer(config=ROOT / "redis.conf") as server:
        yield server.url


def fill(client: redis.Redis) -> None:
    """Cap memory 2 MB above what is used and write until Redis refuses (OOM); then lower
    the cap a little under the use, so that the server stays full whatever its buffers do
    (deleting the filler frees it)."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 2_000_000)
    n = 0
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        while True:
            client.set(f"fill:{n}", b"x" * 10_000)
            n += 1
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 500_000)


def lease_head(client: redis.Redis) -> float:
    head = client.zrange(KEYS.running, 0, 0, withscores=True)
    return head[0][1] if head else 0.0


def test_a_full_server_keeps_leases_stops_claims_and_resumes(
        full_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture,
        start_listener: Callable[..., ListenerThread]) -> None:
    caplog.set_level(logging.WARNING, logger="timers")
    full = redis.Redis.from_url(full_url)
    t = Timers(full_url)
    held = [f"held-{i}" for i in range(10)]
    t.schedule_many(TimerSpec("slow.hold", [tag, 30], in_=0, id=tag) for tag in held)
    listener = start_listener(full_url, tasks="tests.retry_tasks", lease=LEASE, concurrency=20)
    wait_until(lambda: len(calls(r)) == len(held), 10, message="the 10 long tasks to start")

    later = [f"later-{i}" for i in range(5)]
    t.schedule_many(TimerSpec("ok.hit", [tag], in_=1.0, id=tag) for tag in later)
    fill(full)  # takes a few ms: the later timers come due on a full server
    first_deadline = lease_head(full)
    # leases are renewed on the full server: the earliest deadline moves past 3 leases
    wait_until(lambda: lease_head(full) > first_deadline + 3 * LEASE * 1000, 10,
               message="renewals on the full server")
    # the later timers come due while the server is full: their claims are refused
    assert listener.listener is not None
    wait_until(lambda: listener.listener.lanes[0].claimer.memory.full, 10,
               message="a refused claim")
    assert sorted(tag for tag, _ in calls(r)) == sorted(held), "no claim, no rerun under OOM"

    r.set(RELEASE, 1)  # the long tasks end (finish runs on the full server too)
    wait_until(lambda: len(done(r)) == len(held) and full.zcard(KEYS.running) == 0, 10,
               message="the long tasks to end and their endings to be written")
    assert int(full.zcard(KEYS.due)) == len(later), "still pending while the server is full"

    full.delete(*full.keys("fill:*"))
    wait_until(lambda: len(done(r)) == len(held) + len(later), 10,
               message="the later timers once memory frees")
    runs = Counter(tag for tag, _ in calls(r))
    assert runs == Counter({tag: 1 for tag in held + later}), "runs per timer 1"
    # a task returns before its ending is written: wait for the endings, then check them
    wait_until(lambda: full.zcard(KEYS.running) == 0, 10, message="the last endings")
    stats = t.stats()
    assert (stats.pending, stats.running, stats.fired, stats.counters.get("reruns", 0)) == (
        0, 0, len(held) + len(later), 0)

    messages = [rec.getMessage() for rec in caplog.records]
    assert sum("Redis is out of memory" in m for m in messages) == 1, messages
    assert sum("Redis has memory again" in m for m in messages) == 1, messages
    assert not any("lease" in m and "lapsed" in m for m in messages), messages
    t.close()
    full.close()
