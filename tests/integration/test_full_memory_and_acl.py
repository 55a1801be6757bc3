"""Producer and admin operations against a real server that is out of memory (noeviction
at its limit) or runs as an ACL user without pub/sub channels (issue 9 rows 2, 6, 11)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from tests.integration.helpers import run_cli
from timers import AsyncTimers, ServerOutOfMemory, Timers, TimerSpec
from timers.model.keys import Keyspace
from timers.store.scripts import Scripts

pytestmark = pytest.mark.integration
KEYS = Keyspace()


@pytest.fixture
def full(r: redis.Redis) -> Iterator[redis.Redis]:
    """Make the server out of memory: noeviction and a maxmemory below what it uses."""
    old = r.config_get("maxmemory*")
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        yield r
    finally:
        r.config_set("maxmemory", old["maxmemory"])
        r.config_set("maxmemory-policy", old["maxmemory-policy"])


def claim_one(scripts: Scripts) -> tuple[str, str]:
    reply = scripts.claim(limit=1, lease_ms=60_000, horizon_ms=0, listener_id="")
    return reply[3].decode(), reply[4].decode()


def test_schedule_many_under_full_memory_writes_nothing_and_says_so(
    timers_client: Timers, r: redis.Redis, full: redis.Redis
) -> None:
    """Row 11: 20,000 met OOM part-way: 4,000 written, their ids never returned."""
    specs = [TimerSpec("a.b", [i], in_=3600) for i in range(20_000)]
    with pytest.raises(ServerOutOfMemory, match="out of memory") as caught:
        timers_client.schedule_many(specs)
    assert caught.value.written == []
    assert isinstance(caught.value.__cause__, redis.exceptions.OutOfMemoryError)
    with pytest.raises(ServerOutOfMemory):
        timers_client.schedule("a.b", in_=1, id="one")
    r.config_set("maxmemory", 0)
    assert timers_client.stats().pending == 0
    assert r.keys("timers:*") == []


def test_schedule_many_that_fills_memory_part_way_is_all_or_nothing(
    timers_client: Timers, r: redis.Redis, full: redis.Redis
) -> None:
    """Row 11 as it was met: room for a few thousand timers, not 20,000."""
    r.config_set("maxmemory", r.info("memory")["used_memory"] + 1_000_000)
    specs = [TimerSpec("a.b", [i], in_=3600) for i in range(20_000)]
    try:
        ids = timers_client.schedule_many(specs)
    except ServerOutOfMemory as exc:
        ids, written = [], exc.written
    else:
        written = ids
    r.config_set("maxmemory", 0)
    assert timers_client.stats().pending == len(written) == len(ids)
    assert len(ids) in (0, 20_000)


def test_work_that_frees_memory_runs_under_full_memory_and_stats_read(
    timers_client: Timers, redis_url: str, r: redis.Redis, request: pytest.FixtureRequest
) -> None:
    """Row 2 (script half): renewals were refused while claims went on; stats failed."""
    client = redis.Redis.from_url(redis_url)
    scripts = Scripts(client, KEYS)
    for i in range(3):
        timers_client.schedule("a.b", [i], in_=0 if i == 0 else 3600, id=f"t{i}")
    token, _ = claim_one(scripts)
    request.getfixturevalue("full")

    with pytest.raises(redis.exceptions.OutOfMemoryError):
        claim_one(scripts)  # needs memory: refused before it writes
    assert scripts.renew(60_000, [token]) == []
    assert timers_client.reschedule("t1", in_=60) is True
    assert timers_client.cancel("t2") is True
    scripts.finish(retention_ms=1000, endings=[(token, "ok", "", "")])
    stats = timers_client.stats()
    assert (stats.pending, stats.running, stats.fired) == (1, 0, 1)
    shown = run_cli("stats", "--url", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert "pending:  1" in shown.stdout
    client.close()


@pytest.fixture
def no_channels(redis_url: str, r: redis.Redis) -> Iterator[str]:
    """A URL for an ACL user who may use every key and command but no pub/sub channel
    (Redis 7's default for a new user)."""
    r.execute_command("ACL", "SETUSER", "nochan", "on", ">pw", "~*", "resetchannels", "+@all")
    try:
        yield redis_url.replace("redis://", "redis://nochan:pw@", 1)
    finally:
        r.execute_command("ACL", "DELUSER", "nochan")


def test_a_user_who_may_not_publish_schedules_once_and_gets_the_id(
    no_channels: str, timers_client: Timers
) -> None:
    """Row 6 (producer half): ResponseError, yet the timer was written: a retry duplicated."""
    with Timers(no_channels) as producer:
        assert producer.schedule("a.b", [1], in_=60, id="first") == "first"  # the earliest
        assert producer.schedule("a.b", [1], in_=60, id="first") == "first"  # a retry
        generated = producer.schedule("a.b", [2], in_=30)  # earlier still: a wake again
        assert producer.schedule_many([TimerSpec("a.b", [3], in_=10)])
        assert producer.reschedule("first", in_=1) is True
    ids = [t.id for t in timers_client.list()]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 3
    assert {"first", generated} <= set(ids)


def test_the_asyncio_producer_says_out_of_memory_too(
    redis_url: str, full: redis.Redis
) -> None:
    async def scenario() -> None:
        async with AsyncTimers(redis_url) as producer:
            with pytest.raises(ServerOutOfMemory, match="out of memory"):
                await producer.schedule("a.b", in_=1)
            assert (await producer.stats()).pending == 0

    asyncio.run(scenario())
