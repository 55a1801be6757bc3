"""The private names of redis-py the listener reads, pinned.

The listener takes pub/sub replies hiredis has already parsed straight from redis-py's
reader (``timers.listener.finding.events.buffered_reply``): ``redis._parsers._AsyncHiredisParser``,
``redis._parsers.hiredis.NOT_ENOUGH_DATA``, a connection's ``_parser`` and the parser's
``_reader``. Should a redis-py release move one of them, the listener quietly falls back to
``get_message`` for every reply (correct, several times slower on a burst of expiry
events); these tests fail instead, so the upgrade is noticed."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio

from timers.listener.finding import events


class Subscription:
    """What ``buffered_reply`` reads of a pub/sub: its connection."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection


def _connection() -> Any:
    """An asyncio connection with redis-py's hiredis parser, set up as on connect (no
    socket: the parser's reader is fed by hand)."""
    from redis._parsers import _AsyncHiredisParser

    connection = redis.asyncio.Connection(parser_class=_AsyncHiredisParser)
    connection._parser.on_connect(connection)
    return connection


def test_the_listener_finds_redis_py_hiredis_parser_and_its_sentinel() -> None:
    from redis._parsers import _AsyncHiredisParser
    from redis._parsers.hiredis import NOT_ENOUGH_DATA

    assert events._HIREDIS_PARSER is _AsyncHiredisParser
    assert events._NOT_ENOUGH_DATA is NOT_ENOUGH_DATA


def test_a_reply_already_read_is_taken_from_the_connections_reader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "FAST_READ", True)  # on, in CI's run with the tricks off
    connection = _connection()
    subscription = Subscription(connection)
    reader = connection._parser._reader
    reader.feed(b"*3\r\n$8\r\npmessage\r\n$3\r\nabc\r\n$2\r\nhi\r\n*1\r\n$2\r\n")  # one and a part
    assert events.buffered_reply(subscription) == [b"pmessage", b"abc", b"hi"]
    assert events.buffered_reply(subscription) is events.NO_REPLY  # the rest not in yet
    reader.feed(b"ok\r\n")
    assert events.buffered_reply(subscription) == [b"ok"]
