"""Tasks for the retry, deadline, timeout and supervision tests.

A listener runs them as ``tests.retry_tasks.<module>.<function>``, in the test process or
in a subprocess. Each call is written to the Redis server named by ``$TIMERS_TEST_URL``
(the variable the integration fixtures set for ``tests.task_pkg`` too), so a test sees every
call wherever it happened:

- ``retry:calls``    list: ``[tag, n]`` as each call starts, ``n`` counting the calls of ``tag``
- ``retry:done``     list: ``[tag, how]`` as a call returns normally
- ``retry:release``  a key a test sets to let :func:`slow.hold` and its kin return
- ``retry:fixed``    a key a test sets to make :func:`flaky.until_fixed` succeed

The tests flush the database before each test, so these start empty.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from tests.task_pkg import URL_ENV, client

__all__ = ["CALLS", "COUNTS", "DONE", "FIXED", "RELEASE", "URL_ENV", "calls", "client", "done",
           "note_call", "note_done"]

CALLS = "retry:calls"
COUNTS = "retry:counts"
DONE = "retry:done"
RELEASE = "retry:release"
FIXED = "retry:fixed"


def note_call(tag: str) -> int:
    """Record that a call of ``tag`` started; returns how many calls of it there were."""
    r = client()
    n = int(r.hincrby(COUNTS, tag, 1))
    r.rpush(CALLS, json.dumps([tag, n]))
    return n


def note_done(tag: str, how: str = "ok") -> None:
    client().rpush(DONE, json.dumps([tag, how]))


def calls(r: redis.Redis) -> list[list[Any]]:
    """Every ``[tag, n]`` call start, in order."""
    return [json.loads(item) for item in r.lrange(CALLS, 0, -1)]


def done(r: redis.Redis) -> list[list[Any]]:
    """Every ``[tag, how]`` normal return, in order."""
    return [json.loads(item) for item in r.lrange(DONE, 0, -1)]
