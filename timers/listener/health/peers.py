"""The other live listeners of the prefix, as this listener sees them (:mod:`timers.ops.fleet`).

:class:`Peers` reads the fleet view at most every :data:`VIEW_MAX_AGE` seconds (one round
trip, shared by every caller waiting meanwhile) and answers what the executor and the
events need: who else can run a task this listener lacks. It also keeps this listener's
announcement: the digest its heartbeat names and whether the task list itself must be
sent (on the first heartbeat, and again when the view shows it gone).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import redis

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import Entry, as_text
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.wire import Option
from timers.ops.fleet import (
    FleetView,
    Peer,
    encode_task_set,
    fleet_calls,
    fleet_from,
    task_set_digest,
)

log = logging.getLogger("timers.listener")

VIEW_MAX_AGE = 1.0
"""Seconds a read view serves before the next question reads it again."""

Reader = Callable[[], Awaitable[list[Any]]]


class Peers:
    """This listener's view of the others of its prefix, and its own announcement."""

    def __init__(self, me: str, package: str, tasks: Callable[[], tuple[str, ...]],
                 read: Reader, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.me, self.package, self._tasks, self._read = me, package, tasks, read
        self._monotonic = monotonic
        self._view: FleetView | None = None
        self._read_at = -1e9
        """When the read of the view in hand was sent (monotonic)."""
        self._reading: asyncio.Task[FleetView] | None = None
        self._fresh = asyncio.Lock()
        self._digest: str | None = None
        self.resend = True
        """Send the task list with the next heartbeat (the first, or it was found gone)."""
        self._warned: set[str] = set()
        self._unreadable = False

    @classmethod
    def over(cls, client: Any, keys: Keyspace, me: str, package: str,
             tasks: Callable[[], tuple[str, ...]]) -> Peers:
        """Peers read from ``keys`` with an asyncio redis-py ``client``."""
        async def read() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for call in fleet_calls(keys):
                pipe.execute_command(*call.command)
            return list(await pipe.execute())
        return cls(me, package, tasks, read)

    # -- the announcement -------------------------------------------------------------

    @property
    def digest(self) -> str:
        """The digest of this listener's task paths (worked out once they are loaded)."""
        if self._digest is None:
            names = self._tasks()
            if not names:
                return task_set_digest(())
            self._digest = task_set_digest(names)
        return self._digest

    def announcement(self) -> tuple[str, str]:
        """(digest, task list or "" when sent already) for the next heartbeat."""
        digest = self.digest
        if not self.resend:
            return digest, ""
        return digest, encode_task_set(self._tasks()) or ""

    def announced(self) -> None:
        """The heartbeat that carried the list was written."""
        self.resend = False

    def gone_from_server(self) -> None:
        """A heartbeat found this listener's task list gone from ``P|tasks`` (a flush, a
        failover that lost it): send it with the next one."""
        if self._tasks():
            self.resend = True

    # -- the view ---------------------------------------------------------------------

    async def view(self, max_age: float = VIEW_MAX_AGE) -> FleetView:
        """The fleet, read again when the last read is older than ``max_age`` seconds."""
        if self._view is not None and self._monotonic() - self._read_at <= max_age:
            return self._view
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read_view())
        return await asyncio.shield(self._reading)

    async def fresh_view(self) -> FleetView:
        """A view read after this call began (shared by the callers that wait meanwhile:
        a batch of refusals reads it once)."""
        asked = self._monotonic()
        async with self._fresh:
            if self._view is not None and self._read_at >= asked:
                return self._view
            return await self._read_view()

    async def _read_view(self) -> FleetView:
        sent = self._monotonic()
        try:
            view = fleet_from(await self._read())
        except redis.exceptions.ResponseError as exc:  # NOPERM, a key of another type …
            view = FleetView()
            if not self._unreadable:
                self._unreadable = True
                log.warning("cannot read the other listeners' heartbeats (%s): a timer whose "
                            "task this listener lacks is refused, not handed to a listener "
                            "that has it. Allow +time +zrange +hgetall on the "
                            "prefix's keys", exc)
        if sent >= self._read_at:  # (a slower read sent earlier does not replace it)
            self._view, self._read_at = view, sent
        return view

    async def runners(self, task: str, group: str) -> tuple[list[Peer], FleetView]:
        """The other live listeners that can run ``task`` in ``group``, and the view. None
        found is asked again of a view read after this call (a refusal is for good)."""
        view = await self.view()
        found = view.runners(task, group, exclude=self.me)
        if not found:
            view = await self.fresh_view()
            found = view.runners(task, group, exclude=self.me)
        return found, view

    def refusal(self, view: FleetView) -> str:
        """What a refusal says of the others: ``other live listeners: …``."""
        return view.describe(exclude=self.me)

    def run_elsewhere(self, key: bytes, key_start: bytes) -> bool:
        """Whether the cached view shows another listener that runs the timer an expired
        key names (its task and group): then this listener leaves the event alone."""
        view = self._view
        if view is None or not key.startswith(key_start):
            return False
        try:
            entry = Entry.decode(as_text(key[len(key_start):]))
        except MalformedTimerKey:
            return False
        group = entry.record.options.get(Option.GROUP) or DEFAULT_GROUP
        return bool(view.runners(entry.record.task, group, exclude=self.me))

    def screen(self, key: bytes, key_start: bytes) -> Literal["elsewhere", "reject", "ask"]:
        """What to do with an expired key naming a task this listener lacks, from the view
        in hand: leave it to another listener that runs it (``elsewhere``), record it as
        rejected (no view read yet: not serving yet), or ``ask`` a view read after now
        (:meth:`fresh_view`) first: a rejection is for good, and the view in hand, however
        young, may have been read before that listener announced its tasks (two listeners
        starting together)."""
        if self._view is None:
            return "reject"
        return "elsewhere" if self.run_elsewhere(key, key_start) else "ask"

    async def warn_other_packages(self) -> None:
        """At start: warn when the prefix's heartbeats show another tasks package."""
        view = await self.view(max_age=0)
        for peer in view.peers:
            if peer.id == self.me or peer.package == self.package:
                continue
            if peer.package in self._warned:
                continue
            self._warned.add(peer.package)
            log.warning(
                "another tasks package serves this prefix: listener %s runs %r, this one %r. "
                "Each hands the other's timers back to it while both are live; a timer no "
                "live listener can run is recorded as refused. Two apps sharing a Redis "
                "want a prefix each (TIMERS_PREFIX, `timers move --to-prefix` to move "
                "timers over)", peer.id, peer.package, self.package,
                extra={"other_listener": peer.id, "other_package": peer.package})
