"""Placement on a sharded prefix: a claimed run whose limit lives in another shard moves
there, once, at its first claim (rule 3 of :mod:`timers.ops.shards`).

A limit the task declares (a key function, ``concurrency=``, ``rate=``) is known to
listeners only, unless the producer has the task registered by name: then the timer was
born in its limit's shard; otherwise the producer placed it by its id. A limit of N is N on any
number of shards only when its state and every timer it holds back are in one shard: the
shard of its rate's name, else of its concurrency key (:func:`timers.ops.shards.shard_of_key`).
So the lane that claims such a timer in another shard moves it there before any gate sees
it; the lane of that shard claims it again (the move wakes it) and gates it as usual.

Cross-shard atomicity does not exist: a move is four steps, each one script in one shard
(``lua/arrive.lua`` has the protocol, ``docs/state-machine.md`` the transitions):

1. **arrive** (target): the copy is written inert, named ``<from shard>|<run token>``;
2. **depart** (source): the run leaves if it is still held: the move's one commit point;
3. **settle** (target): the copy is pended if the run left, dropped if not;
4. **forget** (source): the note of the departure goes.

A crash or a stall between any two steps leaves the timer runnable exactly once: before
2 the source still holds the run (its lease lapses, a claim reruns it and it moves again;
the inert copy is dropped), after 2 only the copy can run, and any listener settles an
arrival whose deadline passed from the source's facts (:meth:`Placer.settle_lapsed`).
A timer that moved carries ``;sh=<from shard>`` and never moves again. Timers with a key
given at schedule time, recurrences' occurrences, runs of a task of another group (they
move to their group first) and runs of tasks this listener cannot load do not move.
``get``, ``cancel``, ``reschedule`` and ``status`` by id look in the other shards when the
id's own shard does not have it (:mod:`timers.ops.sharded`).

Its lane's claims take a keyed task's timers in due order with the other shards'
(:meth:`Placer.floor`; docs/state-machine.md, Cluster, rule 5).

A prefix of one shard (any single server) has no placer: its claims pay nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from timers.listener.flow.gate import HANDED
from timers.listener.flow.plan import plan_ahead
from timers.listener.retrying import RETRYABLE, pause
from timers.model.encoding import as_text
from timers.model.flow.names import DEFAULT_GROUP
from timers.model.run_record import record_head, record_option, with_options
from timers.model.runs import Run
from timers.model.wire import Option
from timers.ops.shards import shard_of_key
from timers.store.script_rows import Arrival, Departure, Settle
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")

SETTLE_PAGE = 100
"""Lapsed arrivals settled per call."""

LEFT, NOT_HELD, HOLDS_SLOT = 1, 0, 2
"""``depart.lua``'s replies per run (and, for "q", 2 means still held)."""


def _arrival_name(shard: int, token: str) -> str:
    return f"{shard}|{token}"


class Placer:
    """Moves one lane's claimed runs to their limit's shard, and settles the lane's
    arrivals that their mover left unsettled (see the module doc).

    ``scripts_of``: the scripts of shard ``i`` (each lane's); ``index``, ``count``: this
    lane's shard and how many there are; ``hand_back``: gives a claimed run back (pending
    again in this shard); ``redis_now_ms``: the Redis clock as the lane reads it."""

    def __init__(self, scripts_of: Callable[[int], Scripts], index: int, count: int,
                 lease: float, resolve: Callable[[str], Callable[..., Any]], *,
                 hand_back: Callable[[Run], None], redis_now_ms: Callable[[], float],
                 arrived: Callable[[int, int], None] | None = None) -> None:
        self.scripts_of, self.index, self.count = scripts_of, index, count
        self.lease_ms, self.resolve = round(lease * 1000), resolve
        self.hand_back, self.redis_now_ms, self.arrived = hand_back, redis_now_ms, arrived
        self.moved = 0
        """Runs this lane moved to another shard (their copies settled there)."""
        self.in_flight = 0
        """Runs this lane is moving now (a burst is not over meanwhile)."""

    # -- where a run belongs ------------------------------------------------------------

    def home_of(self, run: Run) -> int | None:
        """The shard a claimed run's timer must move to, or None: it stays (no limit, its
        limit lives here, a key given at schedule time, moved already, a recurrence's
        occurrence, a task of another group or one this listener cannot load). Its plan,
        worked out here, is kept on the run for its gate."""
        record_text = run.record_text
        _, options = record_head(record_text)
        if options and any(record_option(record_text, name) is not None for name in
                           (Option.KEY, Option.FROM_SHARD, Option.RECURRENCE)):
            return None
        plan = plan_ahead(record_text, self.resolve, run)  # None: no limit, another group, an error
        if plan is None:
            return None
        home = shard_of_key(plan.home, self.count)
        return None if home == self.index else home

    # -- moving claimed runs ------------------------------------------------------------

    async def place(self, runs: list[Run]) -> list[Run]:
        """The runs that stay in this lane; the others moved (or, on a failure, were given
        back or left to their lease: nothing else starts them here)."""
        moving: dict[int, list[Run]] = defaultdict(list)
        staying: list[Run] = []
        for run in runs:
            home = None if run.source in HANDED else self.home_of(run)
            if home is None:
                staying.append(run)
            else:
                moving[home].append(run)
        if moving:
            count = sum(map(len, moving.values()))
            self.in_flight += count
            try:
                staying += await self._move(moving)
            finally:
                self.in_flight -= count
        return staying

    def _copy(self, run: Run) -> str:
        extra = {Option.FROM_SHARD.value: str(self.index)}
        if run.reruns:
            extra[Option.RERUNS.value] = str(run.reruns)
        return with_options(run.record_text, **extra)

    async def _move(self, moving: dict[int, list[Run]]) -> list[Run]:
        """The four steps for runs by target shard; the runs that stay here after all."""
        copies = {run.token: self._copy(run) for runs in moving.values() for run in runs}
        targets = sorted(moving)
        arrived = await asyncio.gather(
            *(self.scripts_of(t).arrive(self.lease_ms, [
                Arrival(_arrival_name(self.index, r.token), r.due_ms, r.escaped_id,
                        copies[r.token]) for r in moving[t]]) for t in targets),
            return_exceptions=True)
        departing: list[tuple[int, Run]] = []
        for target, reply in zip(targets, arrived, strict=True):
            if isinstance(reply, BaseException):
                log.warning("could not move %d run(s) to shard %d (%s): handed back",
                            len(moving[target]), target, reply)
                for run in moving[target]:
                    self.hand_back(run)
            else:
                departing += [(target, run) for run in moving[target]]
        if not departing:
            return []
        try:
            replies = await self.scripts_of(self.index).depart(
                [Departure(run.token, record_option(run.record_text, Option.GROUP)
                           or DEFAULT_GROUP, target) for target, run in departing])
        except RETRYABLE as exc:  # whether they left is unknown: settle_lapsed decides
            log.warning("moving %d run(s) out of shard %d: %s; settled later",
                        len(departing), self.index, exc)
            return []
        staying: list[Run] = []
        settles: dict[int, list[Settle]] = defaultdict(list)
        for (target, run), reply in zip(departing, replies, strict=True):
            left = int(reply)
            settles[target].append(Settle(_arrival_name(self.index, run.token),
                                          "c" if left == LEFT else "d", run.escaped_id,
                                          copies[run.token]))
            if left == HOLDS_SLOT:
                staying.append(run)  # a rerun holding its cut run's slot runs here
        await self._settle(settles, self.index)
        return staying

    async def _settle(self, settles: dict[int, list[Settle]], source: int) -> None:
        """Step 3 in each target, then step 4 in ``source`` for the moves settled there."""
        targets = sorted(settles)
        done = await asyncio.gather(
            *(self.scripts_of(t).settle(self.lease_ms, settles[t]) for t in targets),
            return_exceptions=True)
        forget: list[str] = []
        for target, reply in zip(targets, done, strict=True):
            if isinstance(reply, BaseException):
                log.warning("settling moves in shard %d: %s; settled later", target, reply)
                continue
            committed = [s for s in settles[target] if s.verdict == "c"]
            self.moved += len(committed)
            forget += [s.name.partition("|")[2] for s in committed]
            if committed and self.arrived is not None:
                self.arrived(target, 0)  # due: its lane claims it at once
        if forget:
            try:
                await self.scripts_of(source).departed(forget, forget=True)
            except RETRYABLE as exc:  # a note left behind: a few bytes, harmless
                log.debug("forgetting %d move(s) of shard %d: %s", len(forget), source, exc)

    # -- order across shards ------------------------------------------------------------

    @staticmethod
    def not_parked(record_text: str) -> bool:
        """Whether the parker leaves a due timer to the claims: one whose key its task
        works out (no key of its own). Its claim moves it to its key's shard, and there it
        enters its key's order through a claim, in due order with its task's timers in the
        other shards (:meth:`floor`); parking it would put it in its key's queue ahead of
        earlier ones still there."""
        return record_option(record_text, Option.KEY) is None

    async def floor(self, groups: Sequence[str], tasks: Sequence[str]) -> int:
        """The floor of this lane's next claim (``claim.lua`` ARGV[8]): the least, over
        the other shards, of the earliest due time a timer of ``tasks`` there may have
        without having entered its limit's order (``park.lua`` "floor": due and in no
        flow queue, or claimed and not gated yet); this shard's timers of ``tasks`` due
        later wait for it (docs/state-machine.md, Cluster, rule 5). One round trip, to
        every other shard at once. A shard that does not answer gives 0: those timers
        wait until it does (a failover takes seconds)."""
        others = [i for i in range(self.count) if i != self.index]
        replies = await asyncio.gather(
            *(self.scripts_of(i).floor(groups, tasks) for i in others),
            return_exceptions=True)
        floor: int | None = None
        for shard, reply in zip(others, replies, strict=True):
            if isinstance(reply, BaseException):
                log.debug("the floor of shard %d: %s; its keyed timers wait", shard, reply)
                return 0
            value = int(reply)
            floor = value if floor is None else min(floor, value)
        return 0 if floor is None else floor

    # -- arrivals their mover left ------------------------------------------------------

    async def settle_lapsed(self) -> int:
        """Settle this shard's arrivals whose deadline passed, from what their source
        shard says: the run left (pend it), it is still held there (wait a lease more)
        or neither (drop it: it never leaves any more). How many were looked at."""
        own = self.scripts_of(self.index)
        keys = own.calls.keys
        client = own.client
        names = [as_text(n) for n in await client.zrangebyscore(
            keys.arrivals, "-inf", round(self.redis_now_ms()), start=0, num=SETTLE_PAGE)]
        if not names:
            return 0
        payloads = await client.hmget(keys.arrival_records, names)
        by_source: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
        for name, payload in zip(names, payloads, strict=True):
            if payload is None:
                continue  # settled meanwhile
            origin, _, token = name.partition("|")
            escaped, _, record = as_text(payload).partition("|")[2].partition(":")
            by_source[int(origin)].append((token, escaped, record))
        for source, arrivals in sorted(by_source.items()):
            if not 0 <= source < self.count:
                continue
            facts = await self.scripts_of(source).departed([t for t, _, _ in arrivals])
            verdicts = {LEFT: "c", HOLDS_SLOT: "x"}
            settles = [Settle(_arrival_name(source, token), verdicts.get(int(fact), "d"),
                              escaped, record)
                       for (token, escaped, record), fact in zip(arrivals, facts, strict=True)]
            settled = sum(1 for s in settles if s.verdict != "x")
            if settled:
                log.info("settled %d move(s) into shard %d that their listener left",
                         settled, self.index)
            await self._settle({self.index: settles}, source)
        return len(names)

    async def settle_lapsed_until(self, stopping: asyncio.Event) -> None:
        """:meth:`settle_lapsed` every half lease until ``stopping``."""
        while not stopping.is_set():
            try:
                await self.settle_lapsed()
            except RETRYABLE as exc:
                log.debug("settling arrivals of shard %d: %s", self.index, exc)
            await pause(self.lease_ms / 2000, stopping)
