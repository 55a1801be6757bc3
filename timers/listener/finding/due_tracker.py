"""When the next timer is due: what lets a listener sleep until then and no longer.

Redis ends a blocking command's timeout only on its periodic tick (tens of ms late), and it
publishes ``expired`` events seconds to minutes late under load. So the listener sleeps on
its own monotonic clock, converted to the Redis clock through an offset measured on every
claim, and wakes exactly when the head of the due index comes due. Producers that schedule
a timer earlier than the head publish its due time on the wake channel
(:meth:`DueTracker.note_due`). This module only does the arithmetic; the listener does the
waiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from timers.model.clock import Clock

CLAIM_LEAD_MS = 4.0
"""How long before a due time the listener claims it: more than a claim's round trip plus
asyncio's millisecond wake jitter, so the run is in hand when its due time comes."""
_MAX_HANDED_DUES = 4096
OFFSET_MAX_AGE = 10.0
"""Seconds after which a clock-offset sample is replaced even by a slower round trip."""


@dataclass
class _OffsetSample:
    offset_ms: float
    rtt_ms: float
    taken: float


class DueTracker:
    """What one listener knows about the next due time and the Redis clock."""

    def __init__(self, clock: Clock, max_sleep: float = 60.0) -> None:
        self.clock = clock
        self.max_sleep = max_sleep
        self.next_due_ms: float | None = None
        self.next_lease_ms: float | None = None
        self.backlogged = False
        """The last claim left timers it would have taken had it had room (a burst, or
        every slot busy): the sweep takes them in due order, so an ``expired`` event adds
        nothing to it."""
        self.defer_ms = 0.0
        """How long after a due time this listener sweeps it: 0, or, for a shard another
        live listener sweeps first, :data:`timers.listener.health.heartbeat.BACKUP_SWEEP_MS`."""
        self._offset: _OffsetSample | None = None
        self._handed_dues: dict[int, float] = {}
        """Due times (ms) this listener gave timers it handed back for another listener,
        and how long after each it sweeps (:meth:`give_way`)."""

    def give_way(self, due_ms: int, ms: float) -> None:
        """This listener handed a timer back for another that has its task, due at
        ``due_ms``: when that is the next due time, it sweeps ``ms`` late, so the other
        claims it first (:mod:`timers.ops.fleet`). Due times long past are forgotten."""
        if len(self._handed_dues) >= _MAX_HANDED_DUES:
            past = self.redis_now_ms() - 1000
            self._handed_dues = {d: m for d, m in self._handed_dues.items() if d > past}
            if len(self._handed_dues) >= _MAX_HANDED_DUES:
                self._handed_dues.clear()
        self._handed_dues[due_ms] = ms

    def _defer_for(self, wake_ms: float) -> float:
        """How long after ``wake_ms`` this listener sweeps (see :meth:`give_way`)."""
        if not self._handed_dues:
            return self.defer_ms
        return max(self.defer_ms, self._handed_dues.get(round(wake_ms), 0.0))

    def observe_time(self, redis_now_us: float, sent: float, received: float) -> None:
        """Learn the Redis clock from a reply stamped ``redis_now_us``.

        ``sent`` and ``received`` are monotonic seconds around the round trip. The sample
        with the shortest round trip is the most exact; a sample older than
        :data:`OFFSET_MAX_AGE` gives way so the estimate follows clock drift.
        """
        rtt_ms = (received - sent) * 1000
        offset_ms = redis_now_us / 1000 - (sent + received) * 500
        best = self._offset
        if best is None or rtt_ms <= best.rtt_ms or received - best.taken > OFFSET_MAX_AGE:
            self._offset = _OffsetSample(offset_ms, rtt_ms, received)

    def observe_heads(self, next_due_ms: float | None, next_lease_ms: float | None) -> None:
        """Replace what is known with the heads a claim just read from Redis."""
        self.next_due_ms = next_due_ms
        self.next_lease_ms = next_lease_ms

    def note_due(self, due_ms: float) -> None:
        """A producer scheduled a timer for ``due_ms``: wake for it if it is the earliest."""
        if self.next_due_ms is None or due_ms < self.next_due_ms:
            self.next_due_ms = due_ms

    @property
    def knows_clock(self) -> bool:
        return self._offset is not None

    def monotonic_at(self, redis_ms: float) -> float:
        """The local monotonic time (seconds) at which the Redis clock reads ``redis_ms``."""
        offset = self._offset.offset_ms if self._offset else 0.0
        return (redis_ms - offset) / 1000

    def monotonic_when_due(self, redis_ms: float) -> float:
        """The local monotonic time (seconds) by which the Redis clock surely reads
        ``redis_ms``: :meth:`monotonic_at` plus the estimate's uncertainty (half the round
        trip it was measured over), so a run started then never starts before its due time
        on the Redis clock."""
        uncertainty_ms = self._offset.rtt_ms / 2 if self._offset else 0.0
        return self.monotonic_at(redis_ms + uncertainty_ms)

    def redis_ms_at(self, monotonic: float) -> float:
        """The Redis clock at local monotonic time ``monotonic`` (seconds)."""
        offset = self._offset.offset_ms if self._offset else 0.0
        return monotonic * 1000 + offset

    def redis_now_ms(self) -> float:
        """The Redis clock now, as estimated; the local monotonic clock before any sample."""
        offset = self._offset.offset_ms if self._offset else 0.0
        return self.clock.monotonic() * 1000 + offset

    def redis_time_ms(self) -> int:
        """The Redis wall clock now in ms, to stamp records with (failure times): the
        estimate once a claim has measured it, the local wall clock before."""
        if self._offset is None:
            return round(time.time() * 1000)
        return round(self.redis_now_ms())

    def next_wake_ms(self) -> float | None:
        """The Redis time of the next thing to do: a due timer or a lapsing lease."""
        heads = [h for h in (self.next_due_ms, self.next_lease_ms) if h is not None]
        return min(heads) if heads else None

    def seconds_until_next(self) -> float:
        """How long to sleep: 0 when something is due, at most ``max_sleep``.

        The wake comes :data:`CLAIM_LEAD_MS` before the next due time: the claim takes
        timers due within that horizon and the listener starts each at its due time.
        """
        wake = self.next_wake_ms()
        if wake is None or not self.knows_clock:
            return 0.0 if not self.knows_clock else self.max_sleep
        delay = (wake - CLAIM_LEAD_MS + self._defer_for(wake) - self.redis_now_ms()) / 1000
        return min(max(delay, 0.0), self.max_sleep)
