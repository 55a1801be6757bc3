"""Tasks that raise: some for a while, some always."""

from __future__ import annotations

import time

from tests.retry_tasks import FIXED, RELEASE, client, note_call, note_done
from timers import task


class Flaky(RuntimeError):
    """What these tasks raise."""


@task(retries=3, backoff=[0.05, 0.1])
def twice(tag: str, failures: int = 2) -> None:
    """Fail the first ``failures`` calls of ``tag``, then succeed."""
    n = note_call(tag)
    if n <= failures:
        raise Flaky(f"{tag} call {n} fails")
    note_done(tag)


@task(retries=2, backoff=[0.05])
def always(tag: str) -> None:
    """Fail every call: after 3 attempts the timer is dead."""
    n = note_call(tag)
    raise Flaky(f"{tag} always fails (call {n})")


def until_fixed(tag: str) -> None:
    """No retries: fail until the key ``retry:fixed`` exists."""
    note_call(tag)
    if not client().exists(FIXED):
        raise Flaky(f"{tag} is not fixed yet")
    note_done(tag)


@task(retries=3, backoff=[0.05])
def fail_when_released(tag: str, seconds: float = 10.0) -> None:
    """Wait until ``retry:release`` exists (or ``seconds`` pass), then fail."""
    note_call(tag)
    r = client()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not r.exists(RELEASE):
        time.sleep(0.01)  # polls for the release, with the deadline above
    raise Flaky(f"{tag} failed after its release")


@task(retries=5000)
def keeps_trying(tag: str) -> None:
    """Many retries with the default backoff (capped at an hour); fails every call."""
    n = note_call(tag)
    raise Flaky(f"{tag} fails again (call {n})")
