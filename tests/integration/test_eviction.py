"""Eviction policies on a real server.

Before: with ``allkeys-lru`` a full server evicted the due index and the records (5,000 of
5,000 pending timers lost, nothing logged) and ``check`` only warned; ``volatile-lru``,
which loses only the expiring keys, was the one ``check`` failed. Now the listener refuses
``allkeys-*`` unless ``--allow-eviction``, and under ``volatile-lru`` every timer fires.
"""

from __future__ import annotations

import asyncio
import warnings
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis

import timers
from tests.conftest import ROOT, wait_until
from tests.integration.helpers import ListenerThread, Processes, run_cli
from tests.retry_tasks import done
from timers import AsyncTimers, EvictionUnsafe, EvictionWarning, Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.keys import Keyspace

pytestmark = pytest.mark.integration

PENDING = 1000
KEYS = Keyspace()


@pytest.fixture
def allkeys(r: redis.Redis) -> Iterator[None]:
    previous = r.config_get("maxmemory-policy")["maxmemory-policy"]
    r.config_set("maxmemory-policy", "allkeys-lru")
    yield
    r.config_set("maxmemory-policy", previous)


def test_the_listener_refuses_allkeys_eviction_unless_allowed(
        allkeys: None, redis_url: str, timers_client: Timers, processes: Processes) -> None:
    timers_client.schedule("ok.hit", ["evictable"], in_=0)
    refused = processes.timers("listen", "--burst", "--url", redis_url,
                               "--tasks", "tests.retry_tasks")
    assert refused.wait(20) == 1
    output = processes.output(refused)
    (line,) = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert "allkeys-lru" in line and "--allow-eviction" in line, output
    assert "Traceback" not in output
    assert timers_client.stats().pending == 1, "nothing claimed"

    allowed = processes.timers("listen", "--burst", "--allow-eviction", "--url", redis_url,
                               "--tasks", "tests.retry_tasks")
    assert allowed.wait(20) == 0, processes.output(allowed)
    assert "every pending timer lost" in processes.output(allowed)
    assert timers_client.stats().fired == 1

    check = run_cli("check", "--url", redis_url)
    assert check.returncode == 1 and "allkeys-lru" in check.stdout


@pytest.fixture
def volatile_url() -> Iterator[str]:
    with EmbeddedServer(config=ROOT / "redis.conf",
                        extra_args=("--maxmemory-policy", "volatile-lru")) as server:
        yield server.url


def test_volatile_eviction_loses_events_not_timers(
        volatile_url: str, r: redis.Redis,
        start_listener: Callable[..., ListenerThread]) -> None:
    client = redis.Redis.from_url(volatile_url)
    with Timers(volatile_url) as t:
        ids = [f"v{i}" for i in range(PENDING)]
        t.schedule_many(TimerSpec("ok.hit", [tid], in_=3, id=tid) for tid in ids)
        # the server reaches maxmemory: Redis evicts keys with a TTL, the timer keys. 10 kB
        # under: evicting every one of them frees only about 40 kB on Valkey 8 (a key
        # costs it some 40 bytes), so a margin near that failed whenever anything else
        # grew meanwhile
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used - 10_000)
        client.set("unrelated", b"x")
        keys_left = sum(1 for _ in client.scan_iter(match=f"{KEYS.timer_key_start}*",
                                                     count=1000))
        assert keys_left < PENDING, "some expiring timer keys were evicted"
        assert client.zcard(KEYS.due) == PENDING, "the due index is whole"
        # some room under the limit for the runs (a claim needs memory: on a server over
        # its limit with nothing left to evict, claims wait, see test_full_memory)
        client.config_set("maxmemory", used + 1_000_000)

        start_listener(volatile_url, tasks="tests.retry_tasks")
        wait_until(lambda: len(done(r)) >= PENDING, 20, message="every timer to fire")
        runs = Counter(tag for tag, _ in done(r))
        assert runs == Counter(dict.fromkeys(ids, 1)), "lost 0, runs per timer 1"
        print(f"\nvolatile-lru: {PENDING - keys_left} of {PENDING} timer keys evicted; "
              f"{len(runs)} fired")
    client.close()


def test_a_producer_on_allkeys_warns_once_per_client_and_strict_refuses(
        allkeys: None, redis_url: str, r: redis.Redis) -> None:
    """Issue 32 item 6: producers wrote into an allkeys-* server silently."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with Timers(redis_url) as t:
                for i in range(3):
                    t.schedule("ok.hit", [i], in_=600)
        timers.configure(redis_url)
        try:
            timers.schedule("ok.hit", ["module"], in_=600)
            timers.schedule("ok.hit", ["module"], in_=600)
        finally:
            timers.configure()  # back to the default client (it connects on first use)

        async def produce() -> None:
            async with AsyncTimers(redis_url) as t:
                await asyncio.gather(*(t.schedule("ok.hit", [i], in_=600) for i in range(5)))

        asyncio.run(produce())
    evicting = [w for w in caught if issubclass(w.category, EvictionWarning)]
    assert len(evicting) == 4, [str(w.message) for w in caught]  # 2 Timers, module, async
    assert all("maxmemory-policy is allkeys-lru" in str(w.message) for w in evicting)
    assert r.zcard(KEYS.due_index()) == 6 + 2 + 5  # warned, and written

    r.flushdb()
    with (Timers(redis_url, strict=True) as strict,
          pytest.raises(EvictionUnsafe, match=r"allkeys-lru.*nothing was written")):
        strict.schedule("ok.hit", ["never"], in_=600)

    async def strict_async() -> None:
        async with AsyncTimers(redis_url, strict=True) as t:
            with pytest.raises(EvictionUnsafe):
                await t.schedule("ok.hit", ["never"], in_=600)

    asyncio.run(strict_async())
    assert r.dbsize() == 0

    r.config_set("maxmemory-policy", "noeviction")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Timers(redis_url, strict=True) as safe:
            safe.schedule("ok.hit", ["fine"], in_=600)
