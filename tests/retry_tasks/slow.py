"""Tasks that take their time: until released, or past their timeout."""

from __future__ import annotations

import asyncio
import time

from tests.retry_tasks import RELEASE, client, note_call, note_done
from timers import task

TIMEOUT = 0.3


def _wait_for_release(seconds: float) -> str:
    r = client()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if r.exists(RELEASE):
            return "released"
        time.sleep(0.01)  # polls for the release, with the deadline above
    return "deadline"


def hold(tag: str, seconds: float = 20.0) -> None:
    """No policy: return once ``retry:release`` exists (or ``seconds`` pass)."""
    note_call(tag)
    note_done(tag, _wait_for_release(seconds))


@task(timeout=TIMEOUT)
def overrun(tag: str, seconds: float = 10.0) -> None:
    """A plain function over its timeout: it cannot be stopped, it returns when released."""
    note_call(tag)
    note_done(tag, _wait_for_release(seconds))


async def _sleep(tag: str, seconds: float) -> None:
    note_call(tag)
    try:
        await asyncio.sleep(seconds)  # the work itself, not a wait for an outcome
    except asyncio.CancelledError:
        note_done(tag, "cancelled")
        raise
    note_done(tag)


@task(timeout=TIMEOUT)
async def sleepy(tag: str, seconds: float = 5.0) -> None:
    """An ``async def`` task that sleeps past its timeout; records ``[tag, "cancelled"]``
    in ``retry:done`` when it is cancelled there."""
    await _sleep(tag, seconds)


@task(timeout=TIMEOUT, retries=1, backoff=[0.05])
async def sleepy_retried(tag: str, seconds: float = 5.0) -> None:
    """The same with one retry."""
    await _sleep(tag, seconds)


@task(timeout=TIMEOUT, retries=1, backoff=[0.05])
def overrun_retried(tag: str, seconds: float = 1.0) -> None:
    """A plain function that always runs ``seconds``, past its timeout, with one retry."""
    note_call(tag)
    time.sleep(seconds)  # the work itself, not a wait for an outcome
    note_done(tag)


@task(timeout=TIMEOUT, retries=1, backoff=[0.05])
def brief(tag: str) -> None:
    """A plain function well within its timeout, with one retry."""
    note_call(tag)
    time.sleep(0.02)  # the work itself, not a wait for an outcome
    note_done(tag)


def nap(tag: str, seconds: float = 0.5) -> None:
    """An ordinary task that takes ``seconds``: long enough to be in flight when a poison
    kills its process."""
    note_call(tag)
    time.sleep(seconds)  # the work itself, not a wait for an outcome
    note_done(tag)
