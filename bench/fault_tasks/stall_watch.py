"""Stalls no fault caused, for the chaos ledger (:mod:`bench.fault_tasks.chaos`).

A listener process can stall with no signal from the nemesis: the machine (a busy host, a
scheduler that starves a session, a VM's hiccup) or the process itself (a thread holding
the GIL). The design treats any stall alike: past the lease, the run the process was in
may finish after its rerun started elsewhere (a late finish), and the fence keeps the
process from starting anything it no longer holds. So the checker needs to know of every
stall, not only the nemesis's ``SIGSTOP``: a thread in each process that imports the chaos
tasks (each listener, each quarantine child) ticks every :data:`TICK` seconds and writes
one ledger line for each gap of :data:`GAP` seconds or more between its ticks::

    {"k": "G", "pid": …, "lid": …, "from": last tick (CLOCK_MONOTONIC s), "to": the next}

The run's harness turns the gaps long enough to let a lease lapse into cuts
(:func:`bench.chaos.nemesis.stall_cuts`); the checker counts them as a note.
"""

from __future__ import annotations

import json
import os
import threading
import time

from bench.fault_tasks.ledger import append_line

TICK = 0.05
"""Seconds between the watch's ticks."""
GAP = 0.25
"""A gap between ticks this long or longer is written down."""

_watching: int | None = None  # the pid whose watch runs (a forked child has none)
_lock = threading.Lock()


def install(listener: str) -> None:
    """Start this process's watch (once per process, a forked child included)."""
    global _watching
    with _lock:
        if _watching == os.getpid():
            return
        _watching = os.getpid()
    threading.Thread(target=_watch, args=(listener,), name="chaos-stall-watch",
                     daemon=True).start()


def _watch(listener: str) -> None:
    last = time.monotonic()
    while True:
        time.sleep(TICK)
        last = tick(listener, last)


def tick(listener: str, last: float) -> float:
    """One tick after the one at ``last``: its gap written down when it is :data:`GAP` or
    longer; the tick's time."""
    now = time.monotonic()
    if now - last >= GAP:
        append_line(json.dumps({"k": "G", "pid": os.getpid(), "lid": listener, "from": last,
                                "to": now}, separators=(",", ":")) + "\n")
    return now
