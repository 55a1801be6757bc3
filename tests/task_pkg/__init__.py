"""Tasks for the integration tests, whose runs the test process can observe.

A listener runs them as ``tests.task_pkg.<module>.<function>``, in the test process or in a
subprocess. Each writes what it did to the Redis server named by ``$TIMERS_TEST_URL``, so a
test sees every run wherever it happened:

- ``test:runs``     list: one JSON array per finished run, ``[tag, *extra]``
- ``test:started``  list: the tag of every run of :func:`slow.block` as it starts

The tests flush the database before each test, so these lists start empty.
"""

from __future__ import annotations

import os
import threading

import redis

URL_ENV = "TIMERS_TEST_URL"
RUNS = "test:runs"
STARTED = "test:started"

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


def client() -> redis.Redis:
    """A client for ``$TIMERS_TEST_URL``, one per URL for the life of the process."""
    url = os.environ.get(URL_ENV)
    if not url:
        raise RuntimeError(f"${URL_ENV} is not set: the test tasks report runs there")
    with _lock:
        found = _clients.get(url)
        if found is None:
            found = _clients[url] = redis.Redis.from_url(url, decode_responses=True)
        return found
