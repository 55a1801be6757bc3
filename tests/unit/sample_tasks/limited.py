"""Tasks behind flow limits, for the in-memory helper's tests."""

from __future__ import annotations

import timers
from tests.unit.sample_tasks.mod import _record

RAN: list[object] = []


@timers.task(rate="2/m")
def rated(n: int) -> None:
    """At most 2 starts a minute: one every 30 s."""
    _record("rated", n)


@timers.task(rate="1/h")
def hourly(n: int) -> None:
    RAN.append(n)


@timers.task(concurrency=1, key=lambda device, command: f"device:{device}")
def command(device: int, command: str) -> None:
    RAN.append(command)
