"""Commands to a device, one at a time per device, that note their fencing token and
``still_held()`` as they start and as they end: a ledger of every run, in whichever
process ran it (the listener's event loop or a thread of it, or a quarantine child).

Each line of the ledger file is ``{"ev": "start"|"end", "id", "token", "held", "pid", "t",
"fenced"}``, ``t`` on the system-wide monotonic clock, read before ``still_held()`` is asked
(one ``O_APPEND`` write a line). ``fenced``, on a start line: when the run's fence let it
start (monotonic, :mod:`bench.fault_tasks.fence_probe`, installed in the test's listeners
and their children: ``$TIMERS_TEST_FENCE_PROBE`` set), or None if no fence was asked.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import timers
from bench.fault_tasks import fence_probe

PROBE_ENV = "TIMERS_TEST_FENCE_PROBE"
if PROBE_ENV in os.environ:  # a listener of the test or its child, not a mere importer
    fence_probe.install()


def note(ledger: str, event: str) -> None:
    """Append one ledger line for the running timer."""
    fenced = fence_probe.passed() if event == "start" else None  # first: nothing between
    timer = timers.current()
    noted = time.monotonic()  # before still_held() is asked
    line = json.dumps({"ev": event, "id": timer.id, "token": timer.fencing_token,
                       "held": timer.still_held(), "pid": os.getpid(), "t": noted,
                       "fenced": fenced}) + "\n"
    fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@timers.task(concurrency=1, key=lambda device, seconds, ledger: f"device:{device}")
def command(device: int, seconds: float, ledger: str) -> None:
    """A command of ``seconds`` to ``device`` (a plain function: a thread, or a child)."""
    note(ledger, "start")
    time.sleep(seconds)  # the command itself, not a wait for an outcome
    note(ledger, "end")


@timers.task(concurrency=1, key=lambda device, seconds, ledger: f"device:{device}")
async def acommand(device: int, seconds: float, ledger: str) -> None:
    """The same as :func:`command`, as an ``async def`` (on the event loop)."""
    note(ledger, "start")
    await asyncio.sleep(seconds)
    note(ledger, "end")
