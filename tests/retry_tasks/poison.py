"""A task that kills its own process, as a segfault in a C extension would."""

from __future__ import annotations

import json
import os
import time

import timers
from tests.retry_tasks import COUNTS, client, note_call
from timers.model.keys import Keyspace

ATTEMPTS = "retry:poison_attempts"
"""list: ``timers.current().attempt`` of each call of :func:`die`."""


def die(tag: str, after_fired: int = 0) -> None:
    """Record the call and its attempt, then ``os._exit(1)``: once ``after_fired`` other
    timers have their endings written (so the crash strands none of them mid-run), or
    after 10 s."""
    note_call(tag)
    client().rpush(ATTEMPTS, timers.current().attempt)
    stats = Keyspace().stats
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and int(client().hget(stats, "fired") or 0) < after_fired:
        time.sleep(0.01)  # polls, with the deadline above
    os._exit(1)


def die_amid(tag: str, others: int) -> None:
    """First call: wait until ``others`` other tags have started (so they are in flight
    alongside it), then ``os._exit(1)``; later calls die at once."""
    if note_call(tag) == 1:
        r = client()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and int(r.hlen(COUNTS)) < others + 1:
            time.sleep(0.01)  # polls, with the deadline above
    os._exit(1)


STARTS = "retry:poison_starts"
"""list: ``[tag, pid]`` as each call of :func:`die_once_claimed` or :func:`die_noting` starts."""


def die_noting(tag: str) -> None:
    """Note the start with the process id, then ``os._exit(1)``."""
    client().rpush(STARTS, json.dumps([tag, os.getpid()]))
    os._exit(1)


def die_once_claimed(tag: str, other: str) -> None:
    """Note the start; the first time, wait until timer ``other`` is held as a run
    (claimed, not started yet: it is due a few ms later), then ``os._exit(1)``, taking it
    down unstarted; later calls die at once."""
    r = client()
    r.rpush(STARTS, json.dumps([tag, os.getpid()]))
    if r.hincrby(COUNTS, tag, 1) == 1:
        runs = Keyspace().running_records
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                f"|{other}:" in run for run in r.hvals(runs)):
            pass  # claimed, the other waits only a few ms for its due time: no sleep
    os._exit(1)
