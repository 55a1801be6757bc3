"""A pending timer as the API shows it: read from what the flow views found in Redis."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from timers.model.encoding import Args, unescape_id
from timers.model.flow.names import DEFAULT_GROUP
from timers.model.wire import Option
from timers.ops import flow_views as views
from timers.ops.base import ms_to_datetime
from timers.ops.flow_views import Found, WaitState


@dataclass(frozen=True)
class PendingTimer:
    """A timer waiting for its due time."""

    id: str
    task: str
    args: Args
    due: datetime
    attempts: int = 0
    group: str = DEFAULT_GROUP
    priority: int = 0
    key: str | None = None
    wait: WaitState | None = None
    """Why a flow gate holds it back (a concurrency key or a rate limit), if one does."""
    waited_from: datetime | None = None
    """The due time it had before a gate held it back."""

    def seconds_left(self, now: datetime) -> float:
        return (self.due - now).total_seconds()

    def held_for(self, now: datetime) -> float | None:
        """Seconds a gate has delayed it so far (None: never held back)."""
        if self.waited_from is None:
            return None
        end = now if self.wait is not None and self.wait.waiting else self.due
        return max(0.0, (end - self.waited_from).total_seconds())


def pending_of(found: Found) -> PendingTimer:
    """A found timer as the API shows it."""
    record = found.record
    waited_from = record.options.get(Option.WAITED_FROM)
    if waited_from is None and found.wait is not None and found.wait.waiting:
        waited_from = str(found.due_ms)  # held at its due time, which it keeps
    return PendingTimer(
        id=unescape_id(found.escaped),
        task=record.task,
        args=record.args,
        due=ms_to_datetime(found.due_ms),
        attempts=int(record.options.get(Option.ATTEMPTS, "0")),
        group=views.group_of(record),
        priority=views.priority_of(record),
        key=views.key_of(record),
        wait=found.wait,
        waited_from=None if waited_from is None else ms_to_datetime(float(waited_from)),
    )
