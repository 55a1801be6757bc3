"""Calling a script again with the keys it asked for (Redis Cluster).

On Redis Cluster only a script's KEYS are checked before it runs. Some keys a script
touches are named by data only the script reads (a timer's expiring key by its stored
record, a concurrency key's queue by the slot a run holds …), so its caller cannot list
them. Where keys are checked (:func:`timers.store.script_modes.declares_keys`), each script
first works out, reading only keys it was given, every key its body may touch, and when
one is missing replies ``[[b"timers:keys"], key, …]`` before its first write
(``lua/declare.lua``): no other reply of a script starts with an array. Its caller calls
it again with those keys added to its KEYS; a script that reads a key's contents to find
more keys may ask once per level (a key's queue, then the records it holds, then their
runs' groups), so a call is sent at most :data:`MAX_CALLS` times.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import redis.exceptions
from redis.crc import key_slot

from timers.exceptions import KeysNotDeclared
from timers.store.steps import Steps, adrive, drive

MAX_CALLS = 8
"""How many times one script call is sent, the keys it asks for added each time: state
may change between two calls (a queue's head goes, another comes), and a script whose
keys are declared level by level asks once per level (at most 3 calls in the unit
suite)."""


def asked_keys(reply: Any) -> list[Any] | None:
    """The keys a script's reply asks for, or None when it is a script's plain reply."""
    if type(reply) is list and reply and type(reply[0]) is list:
        return reply[1:]
    return None


def with_asked(script: str, keys: Sequence[Any], asked: Sequence[Any],
               cluster: bool) -> list[Any]:
    """``keys`` with ``asked`` added (each once). On a cluster every key a script asks
    for must be in the slot of its first key (one shard's keys share one hash tag):
    :class:`~timers.exceptions.KeysNotDeclared` otherwise."""
    have = {_bytes(k) for k in keys}
    more = [k for k in dict.fromkeys(asked) if _bytes(k) not in have]
    if not more:
        raise KeysNotDeclared(f"script {script} asked for keys it was given already: "
                              f"{[_text(k) for k in asked][:5]}")
    if cluster and keys:
        slot = key_slot(_bytes(keys[0]))
        other = [k for k in more if key_slot(_bytes(k)) != slot]
        if other:
            raise KeysNotDeclared(f"script {script} asked for a key outside its shard's "
                                  f"slot {slot}: {_text(other[0])!r}")
    return [*keys, *more]


def too_many(script: str, asked: Sequence[Any]) -> redis.exceptions.TryAgainError:
    """The error for a call that still asked for keys after :data:`MAX_CALLS` calls (the
    shard's state kept changing under it): redis-py's ``TryAgainError``, as for Redis
    Cluster's own ``-TRYAGAIN`` during a slot migration, so that a listener's loops outlive
    it and call again a little later; its ``__cause__`` is a
    :class:`~timers.exceptions.KeysNotDeclared` that says which keys."""
    message = (f"script {script} still asked for keys after {MAX_CALLS} calls (the "
               f"shard's state kept changing): {[_text(k) for k in asked][:5]}")
    error = redis.exceptions.TryAgainError(message)
    error.__cause__ = KeysNotDeclared(message)
    return error


def _bytes(key: Any) -> bytes:
    return key if isinstance(key, bytes) else str(key).encode()


def _text(key: Any) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


class Declaring:
    """A registered script (redis-py ``Script`` or a library
    :class:`~timers.store.lua_library.Function`), called like it (``keys=``, ``args=``):
    called again, up to :data:`MAX_CALLS` times, while its reply asks for keys.
    ``sha`` and ``script`` are the script's (pipelines send it by EVALSHA)."""

    def __init__(self, name: str, runner: Any, cluster: bool = False) -> None:
        self.name = name
        self.runner = runner
        self.cluster = cluster
        self.sha: str = runner.sha
        self.script: str = runner.script
        self.last_calls = 0
        """How many times the last call was sent: a caller that reads the Redis clock in
        the reply (a claim's) cannot time it by the whole call when it was sent more
        than once (the clock was read in the last round trip)."""
        self.last_asked: list[Any] = []
        """The keys the last call asked for, over all its sends, in the order asked: a
        caller may pass them with its next call (a claim's, ``finding/claimer.py``), so
        that it asks for none again."""

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                 client: Any = None) -> Any:
        return drive(self._calls(keys, args, client))

    def _calls(self, keys: Sequence[Any], args: Sequence[Any], client: Any) -> Steps[Any]:
        keys, asked = list(keys), list[Any]()
        self.last_asked = []
        for calls in range(1, MAX_CALLS + 1):
            reply = yield functools.partial(self.runner, keys=keys, args=args, client=client)
            self.last_calls = calls
            more = asked_keys(reply)
            if more is None:
                return reply
            given = len(keys)
            keys, asked = with_asked(self.name, keys, more, self.cluster), more
            self.last_asked += keys[given:]
        raise too_many(self.name, asked)


class AsyncDeclaring(Declaring):
    """:class:`Declaring` on an asyncio client: calling it gives a coroutine."""

    async def __call__(
            self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
            client: Any = None) -> Any:
        return await adrive(self._calls(keys, args, client))
