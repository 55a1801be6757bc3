"""The data format stored in ``P|format``: a listener gives a prefix without one this
release's format as it starts, a producer reads it before its first write, and both refuse
a format newer than they know, in one line, with nothing written."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest
import redis.exceptions

from tests.unit.helpers import make_listener
from timers import AsyncTimers, Timers, UnknownFormat
from timers.listener.health.preflight import check_format
from timers.model.data_format import ABSENT_FORMAT, FORMAT, stored_format
from timers.model.keys import Keyspace

PAST = datetime(2001, 1, 1, tzinfo=UTC)
KEY = Keyspace().data_format  # "timers|format"
NEWER = str(FORMAT + 1)


def listen_once(server: fakeredis.FakeServer, **options: Any) -> None:
    """One listener, started, run until nothing is due, stopped."""

    async def scenario() -> None:
        listener = make_listener(server, **options)
        try:
            await asyncio.wait_for(listener.run(burst=True), 15)
        finally:
            await listener.redis.aclose()

    asyncio.run(scenario())


def contents(fake: fakeredis.FakeRedis) -> dict[bytes, bytes]:
    """Every key of the server and its serialized value."""
    return {key: fake.dump(key) for key in sorted(fake.keys("*"))}


def test_format_1_is_what_an_absent_key_means() -> None:
    assert FORMAT == ABSENT_FORMAT == 1
    assert stored_format(None) == 1
    assert stored_format(b"1") == stored_format("1") == 1
    assert stored_format(b"7") == 7
    for garbled in (b"", b"x", b"-1", b"0", b"1.5", "\u0661"):
        assert stored_format(garbled) is None


def test_a_listener_writes_its_format_where_none_is_and_runs_what_was_there() -> None:
    """A prefix 0.1.0 wrote (no format key): the listener's start writes format 1 there,
    and runs the timer that was already due."""
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    Timers(fake).schedule("mod.add", [1, 2], at=PAST, id="before")
    assert fake.get(KEY) is None

    listen_once(server)

    assert fake.get(KEY) == b"1"
    stats = Timers(fake).stats()
    assert (stats.pending, stats.fired) == (0, 1)


def test_a_listener_keeps_the_format_it_finds() -> None:
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    fake.set(KEY, FORMAT)
    listen_once(server)
    assert fake.get(KEY) == str(FORMAT).encode()


@pytest.mark.parametrize(("stored", "said"), [
    (NEWER, f"timers|format holds data format {NEWER}; this listener knows formats up to 1"),
    ("v2", "timers|format holds 'v2', which is no data format; this listener knows"),
])
def test_a_listener_refuses_a_newer_format_in_one_line_and_writes_nothing(
        stored: str, said: str) -> None:
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    Timers(fake).schedule("mod.add", [1, 2], at=PAST, id="waits")
    fake.set(KEY, stored)
    before = contents(fake)

    with pytest.raises(UnknownFormat) as refused:
        listen_once(server)

    message = str(refused.value)
    assert message.startswith(said) and "upgrade timers" in message
    assert "nothing was written" in message and "\n" not in message
    assert (refused.value.stored, refused.value.known) == (stored, FORMAT)
    assert contents(fake) == before, "the listener wrote nothing, ran nothing"


def test_a_listener_that_cannot_reach_redis_at_first_checks_the_format_once_it_can() -> None:
    server = fakeredis.FakeServer()
    fakeredis.FakeRedis(server=server).set(KEY, NEWER)
    client = fakeredis.FakeAsyncRedis(server=server)
    real, tries = client.pipeline, []

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        tries.append(1)
        if len(tries) == 1:  # Redis not up yet: a passing outage, not a refusal for good
            raise redis.exceptions.ConnectionError("Connection refused")
        return real(*args, **kwargs)

    client.pipeline = pipeline  # type: ignore[method-assign]
    with pytest.raises(UnknownFormat):
        asyncio.run(check_format(client, Keyspace(), asyncio.Event()))
    assert len(tries) == 2, "asked again once Redis answered, not started unchecked"


def test_a_sharded_prefix_keeps_its_format_in_its_home_keyspace() -> None:
    """On a prefix of several shards the format is one key, beside the shard count."""
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    listen_once(server, shards=3)
    assert sorted(fake.keys("*|format")) == [KEY.encode()]
    assert fake.get(Keyspace().shards) == b"3"

    fake.set(KEY, NEWER)
    with Timers(fake, shards=3) as t, pytest.raises(UnknownFormat):
        t.schedule("mod.add", [1], in_=60)
    assert t.list() == []


def test_a_producer_accepts_an_absent_format_and_does_not_write_it(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake) as t:
        t.schedule("a.b", in_=60, id="one")
        assert [p.id for p in t.list()] == ["one"]
    assert fake.get(KEY) is None, "only a listener gives a prefix its format"


def test_a_producer_refuses_every_write_on_a_newer_format_and_writes_nothing(
        fake: fakeredis.FakeRedis) -> None:
    fake.set(KEY, NEWER)
    before = contents(fake)
    with Timers(fake) as t:
        for _ in range(2):
            with pytest.raises(UnknownFormat, match=(
                    rf"^timers\|format holds data format {NEWER}; this producer knows "
                    r"formats up to 1: upgrade timers here .*nothing was written$")):
                t.schedule("a.b", in_=60)
        with pytest.raises(UnknownFormat):
            t.schedule_many([{"task": "a.b", "in_": 60}])
        with pytest.raises(UnknownFormat):
            t.every("tick", "a.b", interval=60)
        assert t.list() == []  # reads still work
    assert contents(fake) == before


def test_a_producer_reads_the_format_once_per_client(fake: fakeredis.FakeRedis) -> None:
    """The format is read on a client's first write, never again: a client made before a
    newer release wrote the prefix goes on; one made after refuses."""
    with Timers(fake) as early:
        early.schedule("a.b", in_=60, id="first")
        fake.set(KEY, NEWER)
        early.schedule("a.b", in_=60, id="second")
        with Timers(fake) as late, pytest.raises(UnknownFormat):
            late.schedule("a.b", in_=60, id="third")
        assert sorted(p.id for p in early.list()) == ["first", "second"]


def test_an_async_producer_refuses_a_newer_format_and_writes_nothing() -> None:
    async def scenario() -> None:
        client = fakeredis.FakeAsyncRedis()
        await client.set(KEY, NEWER)
        async with AsyncTimers(client) as t:
            for _ in range(2):
                with pytest.raises(UnknownFormat, match="this producer knows formats up to 1"):
                    await t.schedule("a.b", in_=60)
            with pytest.raises(UnknownFormat):
                await t.schedule_many([{"task": "a.b", "in_": 60}])
        assert await client.keys("*") == [KEY.encode()]
        await client.delete(KEY)
        async with AsyncTimers(client) as t:
            await t.schedule("a.b", in_=60, id="ok")
            assert [p.id for p in await t.list()] == ["ok"]
        await client.aclose()

    asyncio.run(scenario())
