"""The flow options a producer writes into a timer's record, and reads back.

A record carries ``g=<group>`` only for a group other than ``default``, ``p=<n>`` only for
a priority other than 0 and ``k=<escaped key>`` only with a concurrency key, so a timer
without flow control is stored exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from timers.exceptions import MalformedTimerKey
from timers.model.flow.names import (
    DEFAULT_GROUP,
    check_group,
    check_key,
    check_priority,
    escape_key,
    unescape_key,
)
from timers.model.wire import Option


@dataclass(frozen=True)
class Flow:
    """A timer's group, priority and concurrency key."""

    group: str = DEFAULT_GROUP
    priority: int = 0
    key: str | None = None


def flow_options(group: object, key: object, priority: object) -> dict[str, str]:
    """The record options for a timer; each value checked (:class:`InvalidTimer`)."""
    options: dict[str, str] = {}
    if check_group(group) != DEFAULT_GROUP:
        options[Option.GROUP] = str(group)
    if check_priority(priority) != 0:
        options[Option.PRIORITY] = str(priority)
    if key is not None:
        options[Option.KEY] = escape_key(check_key(key))
    return options


def read_flow(options: Mapping[str, str]) -> Flow:
    """A stored record's flow options (:class:`MalformedTimerKey` if one does not read)."""
    key = options.get(Option.KEY)
    priority = options.get(Option.PRIORITY, "0")
    try:
        value = int(priority)
    except ValueError:
        raise MalformedTimerKey(f"bad priority {priority[:20]!r} in a record") from None
    return Flow(
        group=options.get(Option.GROUP, DEFAULT_GROUP),
        priority=value,
        key=None if key is None else unescape_key(key),
    )
