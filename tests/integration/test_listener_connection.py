"""The listener's connections on either event loop: a write to a connection closed under
it is the ``ConnectionError`` the listener's loops retry, never uvloop's ``RuntimeError``
("the handler is closed"), which stopped a listener when a cluster slot moved mid-run.
The connections it keeps aside for claims and endings (``ReservedConnection``) keep the
client's rules: a timeout, a lost connection and a cancellation each leave the next call
its own reply."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions

from timers import Listener, Timers, TimerSpec
from timers.listener.tuning.event_loop import loop_factory
from timers.store.listener_client import ReservedConnection, listener_client

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

LOOPS = ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(
    importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"))]


def _run(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:  # type: ignore[arg-type]
        runner.run(main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_write_on_a_connection_closed_under_it_is_a_connection_error_and_the_next_works(
        redis_url: str, loop: str) -> None:
    async def main() -> None:
        client = listener_client(redis_url)
        try:
            assert await client.ping()
            connection = await client.connection_pool.get_connection()
            connection._writer.transport.close()  # closed under it, as a cluster client does
            await asyncio.sleep(0)
            with pytest.raises(redis.exceptions.ConnectionError):
                await connection.send_command("PING")
            await client.connection_pool.release(connection)
            assert await client.ping(), "the client reconnects"
        finally:
            await client.aclose()

    _run(loop, main)


# -- the connections kept aside for claims and endings (ReservedConnection) ---------------


@contextlib.asynccontextmanager
async def _reserved_on(url: str) -> AsyncIterator[tuple[redis.asyncio.Redis, ReservedConnection]]:
    """A listener's client for ``url`` and a connection kept aside of it, both closed after."""
    client = listener_client(url)
    reserved = ReservedConnection.of(client)
    assert reserved is not None, "a client made from a plain URL keeps one aside"
    try:
        yield client, reserved
    finally:
        await reserved.aclose()
        await client.aclose()


async def _sent(reserved: ReservedConnection) -> None:
    """Until the call under way on ``reserved`` has been written out (5 s at most)."""
    deadline = time.monotonic() + 5
    while True:
        connection = reserved._connection
        if (reserved._busy and connection is not None and connection.is_connected
                and connection._writer.transport.get_write_buffer_size() == 0):
            return
        assert time.monotonic() < deadline, "the call was never sent"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_reserved_call_past_the_timeout_raises_and_the_next_reads_its_own_reply(
        redis_url: str, paused: redis.Redis, loop: str) -> None:
    async def main() -> None:
        async with _reserved_on(f"{redis_url}?socket_timeout=0.3") as (_client, reserved):
            assert await reserved.execute_command("SET", "k", "before") == b"OK"
            paused.execute_command("CLIENT", "PAUSE", 3000, "ALL")
            with pytest.raises(redis.exceptions.TimeoutError):
                await reserved.execute_command("GET", "k")
            paused.execute_command("CLIENT", "UNPAUSE")
            # the connection that waited was dropped with the reply still to come on it
            assert await reserved.execute_command("ECHO", "mine") == b"mine"
            assert await reserved.execute_command("GET", "k") == b"before"

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_reserved_connection_killed_by_the_server_is_made_again_for_the_same_call(
        redis_url: str, r: redis.Redis, loop: str) -> None:
    async def main() -> None:
        async with _reserved_on(redis_url) as (_client, reserved):
            assert await reserved.execute_command("CLIENT", "SETNAME", "reserved-one")
            assert r.execute_command("CLIENT", "KILL", "USER", "default") >= 1
            # (the kill closed the test's own client too; it reconnects)
            assert await reserved.execute_command("ECHO", "again") == b"again"
            names = [c["name"] for c in r.client_list()]
            assert "reserved-one" not in names, "a new connection, not the killed one"

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_reserved_call_cancelled_midway_leaves_no_reply_for_the_next(
        redis_url: str, paused: redis.Redis, loop: str) -> None:
    async def main() -> None:
        async with _reserved_on(redis_url) as (_client, reserved):
            await reserved.execute_command("SET", "k", "v")
            paused.execute_command("CLIENT", "PAUSE", 2000, "ALL")
            call = asyncio.ensure_future(reserved.execute_command("ECHO", "cancelled"))
            await _sent(reserved)  # its reply is still to come when it is cancelled
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            paused.execute_command("CLIENT", "UNPAUSE")
            assert await reserved.execute_command("ECHO", "next") == b"next"

    _run(loop, main)


def test_calls_made_while_the_reserved_connection_is_busy_go_through_the_client(
        redis_url: str) -> None:
    async def main() -> None:
        async with _reserved_on(redis_url) as (client, reserved):
            replies = await asyncio.gather(
                *(reserved.execute_command("ECHO", str(i)) for i in range(20)))
            assert replies == [str(i).encode() for i in range(20)]
            # one went on the reserved connection, the others on the client's pool
            assert len(client.connection_pool._available_connections) >= 1

    asyncio.run(main())


def test_only_a_client_made_from_a_plain_url_keeps_a_connection_aside(redis_url: str) -> None:
    async def main() -> None:
        own = listener_client(redis_url)
        given = redis.asyncio.Redis.from_url(redis_url)
        try:
            assert ReservedConnection.of(own) is not None
            assert ReservedConnection.of(given) is None, "an app's client is left as it is"
        finally:
            await own.aclose()
            await given.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("given", [False, True])
def test_a_listener_claims_and_ends_on_its_reserved_connections_and_closes_them(
        redis_url: str, r: redis.Redis, given: bool) -> None:
    """A listener made from a URL sends its claims and endings on two connections of their
    own, and closes them as it stops; one given the app's client keeps to that client."""
    ran: list[int] = []
    with Timers(redis_url) as t:
        t.schedule_many([TimerSpec("hit", [i], in_=0) for i in range(30)])

    async def main() -> Listener:
        client = redis.asyncio.Redis.from_url(redis_url) if given else None
        listener = Listener(client or redis_url, registry={"hit": ran.append})
        try:
            await asyncio.wait_for(listener.run(burst=True), 30)
        finally:
            if client is not None:
                await client.aclose()
        return listener

    listener = asyncio.run(main())
    assert sorted(ran) == list(range(30))
    with Timers(redis_url) as t:
        assert t.stats().pending == 0, "every ending written"
    reserved = listener.shared.reserved
    assert len(reserved) == (0 if given else 2)
    assert all(c._connection is None for c in reserved), "closed as the listener stopped"
