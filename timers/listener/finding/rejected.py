"""Expired keys that name no timer a listener can run (:class:`~timers.listener.finding.
events.Rejected`): each recorded as a rejected failure, unless it names a well-formed timer
whose task another live listener of the prefix runs (that one claims it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from timers.listener.endings.ending import Ending
from timers.listener.endings.writer import EndingWriter
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.finding.events import Rejected
from timers.listener.retrying import RETRYABLE
from timers.model.keys import Keyspace
from timers.model.runs import rejected_entry
from timers.model.wire import EndingKind

log = logging.getLogger("timers.listener")


class PeerScreen(Protocol):
    """What :class:`RejectedKeys` asks of the other live listeners of the prefix
    (:class:`timers.listener.health.peers.Peers`)."""

    def screen(self, key: bytes, key_start: bytes) -> str:
        ...

    async def fresh_view(self) -> object:
        ...

    def run_elsewhere(self, key: bytes, key_start: bytes) -> bool:
        ...


class RejectedKeys:
    """A lane's expired keys that name no timer this listener can run: each recorded in
    ``endings`` as a rejected failure (at ``tracker``'s Redis time; ``counted`` tells the
    tally), unless ``peers`` show another live listener that runs its task."""

    def __init__(self, peers: PeerScreen, keys: Keyspace, tracker: DueTracker,
                 endings: EndingWriter, counted: Callable[[], None]) -> None:
        self.peers, self.keys, self.tracker = peers, keys, tracker
        self.endings, self.counted = endings, counted
        self.rejecting: set[asyncio.Task[None]] = set()  # expired keys checked with peers

    def reject(self, event: Rejected) -> None:
        """Record an expired key that names no timer this listener can run; unless it
        names a well-formed timer that another live listener can run (it claims it)."""
        screened = (self.peers.screen(event.key, self.keys.timer_key_start.encode())
                    if event.escaped_id is not None else "reject")
        if screened == "reject":
            self._record_rejected(event)
        elif screened == "ask":  # on a view read after it came
            task = asyncio.create_task(self._reject_unless_run_elsewhere(event))
            self.rejecting.add(task)
            task.add_done_callback(self.rejecting.discard)

    async def _reject_unless_run_elsewhere(self, event: Rejected) -> None:
        peers = self.peers
        with contextlib.suppress(*RETRYABLE):
            await peers.fresh_view()
        if peers.run_elsewhere(event.key, self.keys.timer_key_start.encode()):
            log.debug("expired key %r: another live listener runs its task", event.key[:120])
            return
        self._record_rejected(event)

    def _record_rejected(self, event: Rejected) -> None:
        log.warning("rejected expired key %r: %s", event.key[:120], event.reason)
        failure_id, failure = rejected_entry(event.key, event.reason,
                                             self.tracker.redis_time_ms(), event.escaped_id)
        self.endings.add(Ending("", EndingKind.REJECT, failure_id=failure_id, failure=failure))
        self.counted()
