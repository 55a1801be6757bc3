"""``ledger.mark``: records each run in the file named by ``$TIMERS_FAULT_LEDGER``::

    S <timer id> <pid> <wall-clock start, s>     as the run starts
    E <timer id> <pid> <wall-clock end, s>       when it returns

One ``write`` per line on an ``O_APPEND`` descriptor: lines from several listener processes
never interleave, and whatever a fault does to Redis, the file keeps every run.
"""

from __future__ import annotations

import os
import threading
import time

LEDGER_ENV = "TIMERS_FAULT_LEDGER"

_fd: int | None = None
_lock = threading.Lock()


def _write(kind: str, tid: str) -> None:
    global _fd
    with _lock:
        if _fd is None:
            _fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{kind} {tid} {os.getpid()} {time.time():.6f}\n".encode())


def mark(tid: str, seconds: float = 0.0) -> None:
    """Record the start, work for ``seconds`` (as a slow web call would), record the end."""
    _write("S", tid)
    if seconds > 0:
        time.sleep(seconds)  # the work itself, not a wait for an outcome
    _write("E", tid)
