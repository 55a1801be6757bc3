"""Tasks for the run history's tests."""

from __future__ import annotations

import timers


@timers.task(history=False)
def quiet() -> None:
    """Its ended timers are not kept in the history (its series is)."""


@timers.task(retries=1, backoff=[3600])
def flaky() -> None:
    """Fails; retried in an hour."""
    raise RuntimeError("try later")
