"""``ledger.mark``: the task of every fault scenario.

Each run appends two lines to the file named by ``$TIMERS_FAULT_LEDGER``::

    S <timer id> <pid> <wall-clock start, s>     as the run starts
    E <timer id> <pid> <wall-clock end, s>       when it returns

A line is one ``write`` on a descriptor opened with ``O_APPEND``, so lines from several
listener processes never interleave, and the file does not care what happens to Redis.
The end line is what tells a run that completed from one cut short by a kill; the attempt
number of a run is its place among the start lines of its timer (the task cannot see the
listener's count, and does not need to).
"""

from __future__ import annotations

import os
import threading
import time

LEDGER_ENV = "TIMERS_FAULT_LEDGER"

_fd: int | None = None
_lock = threading.Lock()


def _ledger() -> int:
    global _fd
    with _lock:
        if _fd is None:
            path = os.environ.get(LEDGER_ENV)
            if not path:
                raise RuntimeError(f"${LEDGER_ENV} is not set: where should runs be written?")
            _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return _fd


def append_line(line: str) -> None:
    """Append ``line`` (ending in a newline) to the ledger in one ``write``: lines from
    several processes never interleave (``O_APPEND``)."""
    os.write(_ledger(), line.encode())


def write_mark(kind: str, tid: str) -> None:
    """Append one ledger line: ``kind`` is ``S`` (a run starts) or ``E`` (it returns)."""
    append_line(f"{kind} {tid} {os.getpid()} {time.time():.6f}\n")


def mark(tid: str, seconds: float = 0.0) -> None:
    """Record the start, work for ``seconds`` (a slow task: a web call), record the end."""
    write_mark("S", tid)
    if seconds > 0:
        time.sleep(seconds)
    write_mark("E", tid)
