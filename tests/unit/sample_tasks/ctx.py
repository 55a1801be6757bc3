"""Tasks that write what :func:`timers.current` tells them to a file, one JSON line per run
(a quarantined or a real listener's run happens in another process)."""

from __future__ import annotations

import asyncio
import json
import threading

import timers
from timers import task


def _write(path: str, how: str) -> None:
    timer = timers.current()
    line = {"how": how, "id": timer.id, "task": timer.task, "attempt": timer.attempt,
            "due": timer.due.isoformat(), "original_due": timer.original_due.isoformat(),
            "lateness": timer.lateness, "recurrence": timer.recurrence,
            "thread": threading.current_thread().name}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def sync_note(path: str) -> None:
    _write(path, "sync")


async def async_note(path: str) -> None:
    await asyncio.sleep(0)  # an await point (no time): a coroutine task that yields once
    _write(path, "async")


@task(retries=2, backoff=[0.0])
def fails_once(path: str) -> None:
    """Note the context, and fail on the first attempt."""
    _write(path, "sync")
    if timers.current().attempt == 1:
        raise RuntimeError("first attempt fails")


@task(retries=2, backoff=[0.0])
async def async_fails_once(path: str) -> None:
    _write(path, "async")
    if timers.current().attempt == 1:
        raise RuntimeError("first attempt fails")
