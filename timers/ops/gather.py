"""Operations run side by side: :func:`gather` drives several operations at once, each
step's requests sent together as one round trip (what the views of a sharded prefix,
:mod:`timers.ops.sharded`, read every shard with)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from timers.ops.base import Operation, Request

T = TypeVar("T")


def gather(operations: Sequence[Operation[T]]) -> Operation[list[T]]:
    """Run operations side by side, each step's requests sent as one round trip (one at
    a time when a request must be atomic: a transaction cannot span shards)."""
    results: list[Any] = [None] * len(operations)
    current: dict[int, Request] = {}
    for index, operation in enumerate(operations):
        _advance(operation, index, None, current, results)
    while current:
        batches = ([[i] for i in current] if any(c.atomic for r in current.values() for c in r)
                   else [list(current)])
        for indexes in batches:
            replies = yield [call for i in indexes for call in current[i]]
            start = 0
            for i in indexes:
                request = current.pop(i)
                part, start = replies[start:start + len(request)], start + len(request)
                _advance(operations[i], i, part, current, results)
    return results


def _advance(operation: Operation[Any], index: int, reply: list[Any] | None,
             current: dict[int, Request], results: list[Any]) -> None:
    try:
        current[index] = next(operation) if reply is None else operation.send(reply)
    except StopIteration as done:
        results[index] = done.value
