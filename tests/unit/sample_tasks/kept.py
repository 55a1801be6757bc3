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


@timers.task(history="1h")
def brief() -> None:
    """Its ended timers are kept an hour, whatever the listener's age."""


@timers.task(history=30 * 86400)
def long() -> None:
    """Its ended timers are kept 30 days, longer than the listener's default."""


@timers.task(history=0)
def none() -> None:
    """Its ended timers are not kept (``0`` as ``False``)."""


@timers.task(history_count=3)
def counted() -> None:
    """At most its three newest ended timers are kept."""


@timers.task(history_count=0)
def uncounted() -> None:
    """None of its ended timers are kept (a count of 0)."""
