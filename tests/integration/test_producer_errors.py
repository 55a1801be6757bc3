"""What a producer gets when Redis is not there, does not answer, or answers with an error
(issue 10, bug 4): a :class:`TimersError` in one line, the redis-py error as its cause, and
still a builtin ``ConnectionError`` where the connection is the problem. Also bug 2's leak:
``timers.aio.configure`` closes the client it replaces.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
import redis

import timers
from tests.conftest import wait_until
from timers import AsyncTimers, ServerError, ServerTimeout, ServerUnavailable, Timers

pytestmark = pytest.mark.integration


@pytest.fixture
def refused_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel completes them) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def _schedule_async(url: str) -> BaseException:
    async def main() -> BaseException:
        client = AsyncTimers(url)
        try:
            await client.schedule("a.b", [1], in_=60)
        except BaseException as exc:  # returned for the test to inspect
            return exc
        finally:
            await client.aclose()
        pytest.fail("schedule did not raise")

    return asyncio.run(main())


def _schedule_sync(url: str) -> BaseException:
    with Timers(url) as client, pytest.raises(timers.TimersError) as caught:
        client.schedule("a.b", [1], in_=60)
    return caught.value


@pytest.mark.parametrize("schedule", [_schedule_sync, _schedule_async], ids=["sync", "async"])
def test_a_refused_connection_is_a_timers_error_and_a_connection_error(
    schedule: object, refused_port: int
) -> None:
    error = schedule(f"redis://127.0.0.1:{refused_port}/0")  # type: ignore[operator]
    assert isinstance(error, ServerUnavailable) and isinstance(error, ConnectionError)
    assert isinstance(error.__cause__, redis.exceptions.ConnectionError)
    assert str(error).startswith(f"cannot connect to Redis at 127.0.0.1:{refused_port}: ")
    assert "\n" not in str(error)


@pytest.mark.parametrize("schedule", [_schedule_sync, _schedule_async], ids=["sync", "async"])
def test_a_server_that_never_answers_is_said_so(schedule: object, silent_port: int) -> None:
    """It said "Redis answered with an error: Timeout reading from socket"."""
    error = schedule(f"redis://127.0.0.1:{silent_port}/0?socket_timeout=0.3")  # type: ignore[operator]
    assert isinstance(error, ServerTimeout)
    assert isinstance(error, ConnectionError) and isinstance(error, TimeoutError)
    assert isinstance(error.__cause__, redis.exceptions.TimeoutError)
    assert str(error) == f"Redis at 127.0.0.1:{silent_port} did not answer within 0.3 s"


def test_an_error_reply_is_a_server_error_with_redis_words(
    redis_url: str, r: redis.Redis, timers_client: Timers
) -> None:
    r.set(timers_client.keys.due, "not a sorted set")
    with pytest.raises(ServerError, match=r"answered with an error: WRONGTYPE") as caught:
        timers_client.schedule("a.b", [1], in_=60)
    assert isinstance(caught.value.__cause__, redis.exceptions.ResponseError)
    assert not isinstance(caught.value, ConnectionError)


def _connections(r: redis.Redis, name: str) -> int:
    return sum(1 for c in r.client_list() if c.get("name") == name)


def test_aio_configure_closes_the_connections_of_the_client_it_replaces(
    redis_url: str, r: redis.Redis
) -> None:
    url = f"{redis_url.split('?')[0]}?client_name=replaced"

    async def main() -> None:
        timers.aio.configure(url)
        await timers.aio.schedule("a.b", [1], in_=60)
        assert _connections(r, "replaced") == 1
        timers.aio.configure(redis_url)
        # the loop runs on (the close is a task on it) while a thread watches the server
        await asyncio.to_thread(wait_until, lambda: _connections(r, "replaced") == 0,
                                message="the replaced client's connection to close")
        assert await timers.aio.cancel("nothing") is False  # the new one works

    try:
        asyncio.run(main())
    finally:
        timers.aio.configure()  # the next test makes its own


def test_refused_credentials_are_said_without_the_password(redis_url: str) -> None:
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]
    with Timers(f"redis://nobody:s3cret-pw@{host_port}/0") as client, \
            pytest.raises(ServerUnavailable, match="refused the credentials") as caught:
        client.cancel("x")
    assert f"Redis at {host_port} refused" in str(caught.value)
    assert "s3cret-pw" not in str(caught.value)
    assert isinstance(caught.value.__cause__, redis.exceptions.AuthenticationError)
