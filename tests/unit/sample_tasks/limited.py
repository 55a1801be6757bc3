"""Tasks behind flow gates, for the testing helper's tests."""

from __future__ import annotations

import timers

RAN: list[object] = []


@timers.task(rate="1/h")
def hourly(n: int) -> None:
    RAN.append(n)


@timers.task(concurrency=1, key=lambda device, command: f"device:{device}")
def command(device: int, command: str) -> None:
    RAN.append(command)
