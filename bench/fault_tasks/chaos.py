"""The tasks of the chaos checker (:mod:`bench.chaos`): ``chaos.<name>`` under
``--tasks bench.fault_tasks``.

Every run appends one JSON line as its code starts and one as it returns (or raises) to the
ledger named by ``$TIMERS_FAULT_LEDGER`` (one ``O_APPEND`` write each, see
:mod:`bench.fault_tasks.ledger`)::

    {"k": "S", "id": …, "task": …, "tok": fencing token, "held": still_held(),
     "lid": listener (``$TIMERS_CHAOS_LISTENER``), "pid": …, "mono": CLOCK_MONOTONIC s,
     "rms": the start on the Redis clock (due + lateness, ms, as the listener measured it),
     "att": attempt, "orig": the timer's own due ms, "rec": recurrence name or null,
     "key": concurrency key or null, "seq": place in its key's order or null,
     "fchk": when the run's fence let it start (CLOCK_MONOTONIC s; null: no fence asked)}
    {"k": "E", … the same, "mono"/"rms" at the end, "ok": returned (false: raised)}

The fence's time comes from :mod:`bench.fault_tasks.fence_probe`, installed as this module
is imported in a chaos run's listener (``$TIMERS_CHAOS_LISTENER`` set: the listener, and a
quarantine child as it loads the task; not a test that imports its names), as is
:mod:`bench.fault_tasks.stall_watch`, which adds a ``G`` line for each stall of the
process.

``CLOCK_MONOTONIC`` is one clock for every process of the machine, so starts and ends of
different processes compare; the Redis-clock start is what rate limits are judged on.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import timers
from bench.fault_tasks import fence_probe, stall_watch
from bench.fault_tasks.ledger import append_line

LISTENER_ENV = "TIMERS_CHAOS_LISTENER"
if LISTENER_ENV in os.environ:  # a chaos run's listener or its child, not a mere importer
    fence_probe.install()
    stall_watch.install(os.environ[LISTENER_ENV])

RATE = "4/s"
"""The rate of :func:`rated`: one start every 250 ms."""
CAP = 2
"""The fleet-wide concurrency of :func:`capped`."""
RETRIES = 3


def _line(kind: str, started: dict[str, Any] | None, key: str | None = None,
          seq: int | None = None, ok: bool | None = None) -> dict[str, Any]:
    """Write a start line (``started`` None) or the end line of ``started``; the line."""
    fenced = fence_probe.passed() if started is None else None  # first: nothing in between
    ctx = timers.current()
    mono = time.monotonic()
    if started is None:
        rms = ctx.due.timestamp() * 1000 + ctx.lateness * 1000
    else:
        rms = started["rms"] + (mono - started["mono"]) * 1000
    line: dict[str, Any] = {
        "k": kind, "id": ctx.id, "task": ctx.task, "tok": ctx.fencing_token,
        "held": ctx.still_held(), "lid": os.environ.get(LISTENER_ENV, "?"),
        "pid": os.getpid(), "mono": mono, "rms": round(rms, 3), "att": ctx.attempt,
        "orig": round(ctx.original_due.timestamp() * 1000), "rec": ctx.recurrence,
        "key": key, "seq": seq,
    }
    if ok is not None:
        line["ok"] = ok
    if started is None:
        line["fchk"] = fenced
    append_line(json.dumps(line, separators=(",", ":")) + "\n")
    return line


def _work(seconds: float, key: str | None = None, seq: int | None = None) -> None:
    started = _line("S", None, key, seq)
    if seconds > 0:
        time.sleep(seconds)
    _line("E", started, key, seq, ok=True)


def plain(seconds: float = 0.0) -> None:
    """A plain timer: start, work ``seconds``, end."""
    _work(seconds)


@timers.task(concurrency=1, key=lambda device, seq, seconds: f"dev:{device}")
def keyfn(device: int, seq: int, seconds: float) -> None:
    """One command at a time per device, the key worked out by a key function."""
    _work(seconds, f"dev:{device}", seq)


def keyarg(device: int, seq: int, seconds: float) -> None:
    """One command at a time per device, the key given at schedule (``key=``)."""
    _work(seconds, f"kdev:{device}", seq)


@timers.task(concurrency=1, key=lambda device, seq, seconds: f"adev:{device}")
async def keyasync(device: int, seq: int, seconds: float) -> None:
    """The same as :func:`keyfn`, an ``async def`` on the listener's event loop."""
    started = _line("S", None, f"adev:{device}", seq)
    await asyncio.sleep(seconds)
    _line("E", started, f"adev:{device}", seq, ok=True)


@timers.task(rate=RATE)
def rated(n: int) -> None:
    """Starts spread at :data:`RATE` fleet-wide."""
    _work(0.0)


@timers.task(concurrency=1, key=lambda device, seq, seconds: f"rdev:{device}", rate=RATE)
def keyrated(device: int, seq: int, seconds: float) -> None:
    """One command at a time per device, and starts spread at :data:`RATE` fleet-wide
    (a rate of its own): each start keeps the rate's interval and its key's order."""
    _work(seconds, f"rdev:{device}", seq)


@timers.task(concurrency=CAP)
def capped(n: int, seconds: float) -> None:
    """At most :data:`CAP` runs at once fleet-wide."""
    _work(seconds, "task:chaos.capped")


@timers.task(retries=RETRIES, backoff=[0.5, 0.5, 0.5])
def flaky(n: int, fails: int) -> None:
    """Raises on its first ``fails`` attempts (fewer than its retries), then returns."""
    started = _line("S", None)
    if timers.current().attempt <= fails:
        _line("E", started, ok=False)
        raise RuntimeError(f"attempt {timers.current().attempt} of {fails} that fail")
    _line("E", started, ok=True)


def poison(n: int) -> None:
    """Kills the process running it (as a segfault in a C extension would)."""
    _line("S", None)
    os._exit(3)


def tick() -> None:
    """An occurrence of a recurrence."""
    _work(0.0)


def moved(n: int) -> None:
    """A timer of the batch ``timers move`` takes to the other prefix."""
    _work(0.0)
