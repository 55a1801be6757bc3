"""Event loops and the asyncio producers, on the in-memory server: the default of
``timers.aio`` is one client per loop, also under :class:`timers.testing.TimersTest`; an
explicit :class:`AsyncTimers` refuses a second loop before sending anything."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest

import timers.aio
from timers import AsyncTimers, WrongEventLoop
from timers.testing import TimersTest


def test_the_aio_default_under_timers_test_works_from_two_loops_in_turn() -> None:
    with TimersTest() as t:
        asyncio.run(timers.aio.schedule("a.b", [1], in_=60, id="first"))
        asyncio.run(timers.aio.schedule("a.b", [2], in_=60, id="second"))
        assert sorted(p.id for p in t.pending()) == ["first", "second"]


def test_an_explicit_async_timers_refuses_a_second_loop_and_sends_nothing() -> None:
    server = fakeredis.FakeServer()
    client = AsyncTimers(fakeredis.FakeAsyncRedis(server=server))
    asyncio.run(client.schedule("a.b", [1], in_=60, id="first"))
    with pytest.raises(WrongEventLoop, match=r"^this AsyncTimers belongs to another event loop"):
        asyncio.run(client.schedule("a.b", [2], in_=60, id="second"))
    assert fakeredis.FakeRedis(server=server).zrange("timers|due", 0, -1) == [b"first"]


def test_timers_aio_aclose_outside_any_use_does_nothing() -> None:
    asyncio.run(timers.aio.aclose())  # no default made on this loop: nothing to close


def test_configure_again_closes_the_client_it_replaces_on_its_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timers.aio, "_default", timers.aio._default)  # restored after
    closed: list[AsyncTimers] = []

    async def note_close(self: AsyncTimers) -> None:
        closed.append(self)

    monkeypatch.setattr(AsyncTimers, "aclose", note_close)

    async def replace() -> AsyncTimers:
        first = timers.aio.configure(fakeredis.FakeAsyncRedis())
        await timers.aio.schedule("a.b", [1], in_=60)  # the first client, used on this loop
        timers.aio.configure(fakeredis.FakeAsyncRedis())
        for _ in range(3):
            await asyncio.sleep(0)  # its close, a task on this loop
        return first

    first = asyncio.run(replace())
    assert closed[:1] == [first], "the replaced client was closed on its loop"
