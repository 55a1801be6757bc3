"""Tasks the unit tests schedule, plus things that look callable but must never run."""

from __future__ import annotations

import json  # noqa: F401 - a module attribute: "mod.json" must be refused
import threading
from os import system  # noqa: F401 - defined outside the package: must be refused
from typing import Any

CALLS: list[tuple[str, Any]] = []
"""Every call of a task below, in order: (task name, what it was called with)."""
_lock = threading.Lock()
VALUE = 42  # not callable


def _record(name: str, value: Any) -> None:
    with _lock:
        CALLS.append((name, value))


def add(a: int, b: int = 0) -> int:
    _record("add", (a, b))
    return a + b


def greet(name: str, greeting: str = "hello") -> None:
    _record("greet", f"{greeting} {name}")


async def async_add(a: int, b: int = 0) -> None:
    _record("async_add", (a, b))


def boom(message: str) -> None:
    raise ValueError(message)


def _private() -> None:
    _record("_private", None)


class Thing:
    def __call__(self) -> None:
        _record("Thing", None)
