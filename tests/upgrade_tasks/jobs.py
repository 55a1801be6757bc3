"""The tasks: a plain one, one a concurrency key holds to one run at a time, one a rate
limits (see :mod:`tests.upgrade_tasks`)."""

from __future__ import annotations

import os
import threading
import time

import timers

LEDGER_ENV = "TIMERS_UPGRADE_LEDGER"
RATE = "20/s"
"""The rate of :func:`paced`: one start every :data:`INTERVAL_MS`, fleet-wide."""
INTERVAL_MS = 50
KEYED_SECONDS = 0.02
"""How long a run of :func:`keyed` works: long enough for two runs of a key to overlap,
should a limit let them."""

_fd: int | None = None
_lock = threading.Lock()


def _note(kind: str, tag: str, start: int) -> None:
    global _fd
    with _lock:
        if _fd is None:
            _fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = f"{kind} {tag} {timers.__version__} {os.getpid()} {start} {time.monotonic_ns()}\n"
    os.write(_fd, line.encode())


def plain(tag: str) -> None:
    """A task with no limit."""
    _note("plain", tag, time.monotonic_ns())


@timers.task(concurrency=1)
def keyed(tag: str) -> None:
    """One run at a time per concurrency key (``schedule(..., key=...)``)."""
    start = time.monotonic_ns()
    time.sleep(KEYED_SECONDS)  # the work itself, not a wait for an outcome
    _note("keyed", tag, start)


@timers.task(rate=RATE)
def paced(tag: str) -> None:
    """At most :data:`RATE` starts, fleet-wide."""
    _note("paced", tag, time.monotonic_ns())
