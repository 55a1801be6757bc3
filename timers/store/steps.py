"""A sequence of Redis calls written once for both kinds of client.

A generator yields each I/O step as a callable of no arguments (a redis-py call, bound
with its arguments) and is sent the step's result, or has its error thrown in at the
``yield``; it returns the sequence's result. :func:`drive` runs it on a sync client;
:func:`adrive` on an asyncio one, whose calls give awaitables. The transport's sends, the
producer's first reads and the declaring scripts' calls are written so.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")
Steps = Generator[Callable[[], Any], Any, T]
"""The I/O steps of a sequence, each a callable whose result (awaited, on an asyncio client)
is sent back, or whose error is thrown in; it returns the sequence's result."""


def drive(steps: Steps[T]) -> T:
    """Run ``steps`` on a sync client: each step's result sent back, its error thrown in."""
    try:
        step = next(steps)
        while True:
            try:
                done = step()
            except Exception as exc:
                step = steps.throw(exc)
            else:
                step = steps.send(done)
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]


async def adrive(steps: Steps[T]) -> T:
    """:func:`drive` on an asyncio client: each step's result is awaited."""
    try:
        step = next(steps)
        while True:
            try:
                done = await step()
            except Exception as exc:
                step = steps.throw(exc)
            else:
                step = steps.send(done)
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]
