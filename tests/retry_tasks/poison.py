"""A task that kills its own process, as a segfault in a C extension would."""

from __future__ import annotations

import os
import time

from tests.retry_tasks import COUNTS, client, note_call
from timers.keys import Keyspace


def die(tag: str, after_fired: int = 0) -> None:
    """Record the call, then ``os._exit(1)``: once ``after_fired`` other timers have their
    endings written (so the crash strands none of them mid-run), or after 10 s."""
    note_call(tag)
    stats = Keyspace().stats
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and int(client().hget(stats, "fired") or 0) < after_fired:
        time.sleep(0.01)
    os._exit(1)


def die_amid(tag: str, others: int) -> None:
    """First call: wait until ``others`` other tags have started (so they are in flight
    alongside it), then ``os._exit(1)``; later calls die at once."""
    if note_call(tag) == 1:
        r = client()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and int(r.hlen(COUNTS)) < others + 1:
            time.sleep(0.01)
    os._exit(1)
