"""Runs handed to this listener by its own batches of endings.

When a run ends and frees a slot of its concurrency key, ``finish.lua`` hands the next
timer waiting for that key straight to the listener that wrote the ending, as a run of its
own (no wake, no claim, no race between listeners): the handoff a waiting device command
sees is one round trip. The listener offers its free slots per batch; they are kept for
the batch until its reply is read, so a claim meanwhile does not count on them too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from timers.model.runs import Run
from timers.store.script_rows import Taker


class Handoff:
    """The slots kept for a batch of endings in flight, and what becomes of its runs.

    ``free_slots``: the listener's; ``start`` and ``hand_back`` a handed run;
    ``slot_freed``: told when a batch's reserved slots come back; ``holding``: the tokens of
    this listener's runs that hold a concurrency key slot (the flow gate's set)."""

    def __init__(self, listener_id: str, groups: Sequence[str], lease: float,
                 free_slots: Callable[[], int], stopping: asyncio.Event,
                 start: Callable[[Run], None], hand_back: Callable[[Run], None], *,
                 slot_freed: Callable[[], None], holding: set[str]) -> None:
        self.listener_id, self.groups, self.lease = listener_id, tuple(groups), lease
        self.free_slots, self.stopping = free_slots, stopping
        self.start, self.hand_back = start, hand_back
        self.slot_freed, self.holding = slot_freed, holding
        self.reserved = 0

    def taker(self, tokens: list[str]) -> Taker:
        """What a batch of endings of ``tokens`` may hand over: one run per slot it frees,
        up to the free slots (none once stopping). Batches that free no slot keep none, so
        the claims of unlimited timers never wait for them."""
        freeing = sum(1 for token in tokens if token in self.holding)
        self.holding.difference_update(tokens)
        if not freeing or self.stopping.is_set():
            return Taker(self.listener_id, self.groups, 0, 0)
        take = min(freeing, max(self.free_slots(), 0))
        self.reserved += take
        # a run next in line takes no free slot: it takes the place of the one before it
        return Taker(self.listener_id, self.groups, take, round(self.lease * 1000), True)

    def handed(self, runs: list[Run], reserved: int) -> None:
        """A batch's reply: start its runs (hand them back if the listener is stopping)."""
        self.reserved -= reserved
        for run in runs:
            (self.hand_back if self.stopping.is_set() else self.start)(run)
        if reserved:
            self.slot_freed()
