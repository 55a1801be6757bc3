"""The starts of a rate limit as Redis itself makes them, for the tests of invariant 13.

``gate.lua`` notes each start it lets go in its rate's hash (``last``, the Redis clock's ms
then, and ``by``, whose). A run that did not start and asked again (T29) is let go anew: its
new ``last`` replaces its own start noted just before, which never happened (its slots moved
on by as much). :class:`RateStarts` reads every such write off ``MONITOR`` (which shows the commands
a script or function runs), from a thread, reconnecting when the server goes away: the
gaps between them are the gaps the rate limit is made to keep, free of what a task's own
timestamp adds (its listener's dispatch: ±15 ms on a loaded 2-core machine, ~100 ms right
after a reconnect), and free of a task that reads ``last`` after the next start wrote it.
A start after a restart comes an interval and more after the server's start (T21 of
docs/state-machine.md), long after the monitor is back.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from types import TracebackType

import redis

from tests.conftest import wait_until


class RateStarts:
    """A context manager: while it lasts, every ``last`` written to the hash ``rate_key``
    of the server at ``url`` (the server may restart on the same address)."""

    def __init__(self, url: str, rate_key: str) -> None:
        self.url, self.rate_key = url, rate_key
        self._starts: list[float] = []
        self._last_by = ""
        """Whose start was noted last (``by``'s token)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rate-starts", daemon=True)

    def __enter__(self) -> RateStarts:
        self._thread.start()
        wait_until(self._watching.is_set, 10, message="MONITOR to be on")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        with contextlib.suppress(redis.RedisError):  # a command the monitor sees: it stops
            redis.Redis.from_url(self.url, socket_timeout=1).ping()
        self._thread.join(5)

    def times(self) -> list[float]:
        """The ms of every start seen so far, in order."""
        with self._lock:
            return sorted(self._starts)

    def gaps(self) -> list[float]:
        """The ms between consecutive starts."""
        return [round(b - a, 1) for a, b in itertools.pairwise(self.times())]

    def _note(self, command: str) -> None:
        parts = command.split(" ")
        if len(parts) < 4 or parts[0].upper() != "HSET" or parts[1] != self.rate_key:
            return
        fields = dict(zip(parts[2::2], parts[3::2], strict=False))
        if "last" not in fields:
            return
        by = fields.get("by", "").rpartition("|")[0]
        with self._lock:
            if by and by == self._last_by and self._starts:
                self._starts.pop()  # asked again (T29): that start never happened
            self._starts.append(float(fields["last"]))
            self._last_by = by

    def _watch(self) -> None:
        while not self._stop.is_set():
            client = redis.Redis.from_url(self.url, decode_responses=True)
            try:
                with client.monitor() as monitor:
                    self._watching.set()
                    for seen in monitor.listen():
                        if self._stop.is_set():
                            return
                        self._note(seen["command"])
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                self._stop.wait(0.005)  # the server is away: connect again
            finally:
                client.close()
