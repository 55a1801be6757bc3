"""Park a backlog of due timers whose concurrency key is full, without claiming them.

When 1,000 commands for 50 devices come due at once, 950 of them must wait. Claimed a
listener's free slots at a time, each would be a claim and a gate away from its key's
queue, and a near-full listener (a few free slots) would spend hundreds of round trips on
it while its runs wait for the event loop. The parker reads the due backlog (``park.lua``
"peek"), works out each timer's key the way the gate does (a task's key is a function of
its args), and parks those whose key is full in one call (``park.lua`` "park"): the same
queue, by priority then due time, that the gate would have put them in. Timers whose key
has room, with a rate limit, of another task group, recurring, or whose task this listener
cannot import are left to the claims, which decide them as before.

It runs only while the listener is backlogged and its gates hold runs back (after a pass
that found nothing, only once they have held another ``REARM``), so listeners of unlimited
timers never pay for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from timers.listener.flow.gate import FlowGate
from timers.listener.flow.plan import plan_ahead
from timers.model.encoding import as_text
from timers.store.script_rows import ParkTimer
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")

PEEK = 200
"""Due timers read per pass."""
REARM = 20
"""Runs held back by a gate after a pass that found nothing to park before the next pass:
a backlog of mostly unlimited timers is not read over and over."""


class Parker:
    """Parks the due backlog's timers whose concurrency key is full (see module doc)."""

    def __init__(self, scripts: Scripts, groups: Sequence[str], lease: float,
                 resolve: Callable[[str], Callable[..., Any]], flow: FlowGate,
                 moves: Callable[[str], bool] | None = None) -> None:
        self.scripts, self.groups, self.lease = scripts, tuple(groups), lease
        self.resolve, self.flow = resolve, flow
        self.moves = moves
        """On a prefix of several shards: whether a timer (its record) is left to the
        claims: one whose key its task works out moves to its key's shard at its claim
        (:mod:`timers.listener.flow.placer`), and in that shard enters its key's order only
        through claims, in due order with its task's timers in the other shards (their
        floor: ``claim.lua`` ARGV[8])."""
        self.parked = 0
        """Timers parked so far (for the tests and the curious)."""
        self._armed_at = 1

    def wanted(self) -> bool:
        """Whether a pass may pay: gates have held runs back since the last empty pass."""
        return self.flow.held >= self._armed_at

    async def park_backlog(self) -> int:
        """One pass over the head of the due backlog; how many timers it parked."""
        reply = await self.scripts.peek(PEEK, self.groups)
        items = [as_text(x) for x in reply]
        timers = [t for t in (self._parkable(*items[i:i + 3]) for i in range(0, len(items), 3))
                  if t is not None]
        parked = int(await self.scripts.park(round(self.lease * 1000), timers)) if timers else 0
        if not parked:  # nothing to gain until gates hold more back
            self._armed_at = self.flow.held + REARM
        self.parked += parked
        return parked

    def _parkable(self, escaped_id: str, due: str, record_text: str) -> ParkTimer | None:
        """The timer with its key and limit, if a gate would weigh only its key."""
        plan = plan_ahead(record_text, self.resolve)
        if plan is None or not plan.key_only or (self.moves is not None
                                                  and self.moves(record_text)):
            return None
        return ParkTimer(escaped_id, record_text, plan.key, plan.limit)
