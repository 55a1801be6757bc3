"""The speed layer's switch (:mod:`timers.speed`): each trick named in ``$TIMERS_SPEED_OFF``
is off where it is set up, and timers falls back on redis-py's public API and Python's
defaults (CI runs the whole unit suite once with ``TIMERS_SPEED_OFF=all``)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc

import hiredis
import pytest
import redis
import redis.asyncio

from timers import AsyncTimers, Timers, speed
from timers.listener.finding import events
from timers.listener.tuning import collector
from timers.model.fast_init import fast_init
from timers.store import listener_client
from timers.store.connect import AsyncScriptConnection, ScriptConnection
from timers.store.listener_client import ReservedConnection

URL = "redis://127.0.0.1:1/0"  # never connected to: the tests make clients, send nothing


def test_the_names_say_which_tricks_are_off() -> None:
    assert speed.off_names("") == frozenset()
    assert speed.off_names(" reader , gc") == {"reader", "gc"}
    assert speed.off_names("all") == set(speed.TRICKS)
    with pytest.raises(ValueError, match=r"TIMERS_SPEED_OFF: no speed trick named 'fast'"):
        speed.off_names("gc,fast")


def test_each_trick_is_on_unless_named_and_connections_need_packing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(speed.ENV, raising=False)
    assert all(speed.on(trick) for trick in speed.TRICKS)
    monkeypatch.setenv(speed.ENV, "packing")
    assert not speed.on("packing") and not speed.on("connections") and speed.on("reader")
    monkeypatch.setenv(speed.ENV, "gc,nonsense")
    with pytest.warns(UserWarning, match="no speed trick named 'nonsense'"):
        assert not speed.on("gc")
    assert speed.on("init")


def test_with_init_off_a_dataclass_keeps_its_own_init_once_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(speed.ENV, "init")

    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int
        y: int = 2

    own = Point.__init__
    assert fast_init(Point).__init__ is own and Point(1) == Point(1, 2)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Refused:
        x: int

    with pytest.raises(TypeError, match="keyword-only"):
        fast_init(Refused)
    monkeypatch.delenv(speed.ENV)

    @dataclasses.dataclass(frozen=True)
    class Fast:
        x: int

    own = Fast.__init__
    assert fast_init(Fast).__init__ is not own and Fast(3).x == 3


def test_with_gc_off_the_collector_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(speed.ENV, "gc")
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    collector.tune()
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == frozen


def test_with_reader_off_replies_are_left_to_get_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from redis._parsers import _AsyncHiredisParser

    connection = redis.asyncio.Connection(parser_class=_AsyncHiredisParser)
    connection._parser.on_connect(connection)
    connection._parser._reader.feed(b"*3\r\n$8\r\npmessage\r\n$1\r\na\r\n$1\r\nb\r\n")

    class Subscription:
        def __init__(self) -> None:
            self.connection = connection

    monkeypatch.setattr(events, "FAST_READ", False)
    assert events.buffered_reply(Subscription()) is events.NO_REPLY


def test_with_packing_off_redis_py_packs_the_listeners_commands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(args: object) -> list[bytes]:
        raise AssertionError("packed by hiredis")

    monkeypatch.setattr(listener_client, "PACK_IN_C", False)
    monkeypatch.setattr(hiredis, "pack_command", refused)
    kind = listener_client.listener_connection(redis.asyncio.connection.Connection)
    packed = b"".join(kind().pack_command("EVALSHA", "abc", 0, "x"))
    assert packed == b"*4\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n0\r\n$1\r\nx\r\n"


@pytest.mark.parametrize("off", ["connections", "packing"])
def test_with_connections_off_script_calls_take_the_clients_own_path(
        monkeypatch: pytest.MonkeyPatch, off: str) -> None:
    sync = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(URL))
    pooled = redis.asyncio.Redis(
        connection_pool=redis.asyncio.BlockingConnectionPool.from_url(URL))
    listener = listener_client.listener_client(URL)
    monkeypatch.delenv(speed.ENV, raising=False)
    assert ScriptConnection.of(sync) is not None
    assert AsyncScriptConnection.of(pooled) is not None
    assert ReservedConnection.of(listener) is not None
    monkeypatch.setenv(speed.ENV, off)
    assert ScriptConnection.of(sync) is None
    assert AsyncScriptConnection.of(pooled) is None
    assert ReservedConnection.of(listener) is None
    sync.close()
    asyncio.run(pooled.aclose())
    asyncio.run(listener.aclose())


@pytest.mark.parametrize("off", ["", "connections"])
def test_a_clients_script_calls_go_on_its_kept_connection_unless_the_trick_is_off(
        monkeypatch: pytest.MonkeyPatch, off: str) -> None:
    """A client made from a plain URL sends each script's FCALL on the connection it keeps
    for script calls; with ``connections`` off, through redis-py's own path."""
    monkeypatch.setenv(speed.ENV, off)
    with Timers(URL) as sync:
        sent_by = sync._scripts["schedule"].execute.__self__
        assert isinstance(sent_by, ScriptConnection) != bool(off)

    async def asynchronous() -> object:
        client = AsyncTimers(URL)
        try:
            return client._scripts["schedule"].execute.__self__
        finally:
            await client.aclose()

    sent_by = asyncio.run(asynchronous())
    assert isinstance(sent_by, AsyncScriptConnection) != bool(off)
