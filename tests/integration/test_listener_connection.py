"""The listener's connections on either event loop: a write to a connection closed under
it is the ``ConnectionError`` the listener's loops retry, never uvloop's ``RuntimeError``
("the handler is closed"), which stopped a listener when a cluster slot moved mid-run."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis.exceptions

from timers.listener.event_loop import loop_factory
from timers.store.listener_client import listener_client

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
