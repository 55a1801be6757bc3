"""The claimer: the due-driven sweep loop and the claim script call.

It sleeps until the earliest due time or lease deadline (see :class:`DueTracker`), then
claims what is due, up to the free task slots, in one atomic script call: the ids events
named first, then the head of the due index, then runs whose lease lapsed. Every timer
goes through this one claim, whichever path found it, so each runs once however many
listeners race for it. It sweeps at start and whenever poked (after every resubscribe,
which covers events lost while the listener was away).

A full server, or a claim too few replicas had (``replicas=n``), stops its claims for
a while (:mod:`timers.listener.finding.guards`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from timers.listener.endings.writer import MAX_BATCH
from timers.listener.finding.due_tracker import CLAIM_LEAD_MS, DueTracker
from timers.listener.finding.guards import MemoryGuard, ReplicaGuard
from timers.listener.flow.parker import Parker
from timers.listener.leases import still_held
from timers.listener.retrying import RETRYABLE, Outage, Retry, pause
from timers.model.clock import Clock
from timers.model.run_record import record_head, record_option
from timers.model.runs import Run
from timers.model.wire import Option
from timers.store.permissions import is_permanent
from timers.store.replicated import UnreplicatedReply
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")

_HORIZON_MS = round(2 * CLAIM_LEAD_MS)
"""A claim also takes timers due within this long from the Redis clock (ms): twice the
lead it is sent with, so those are in hand when their due time comes."""
PARK_PASSES = 5
"""Parking passes after one claim at most (each reads the head of the backlog)."""
FLOOR_RETRY_S = 0.02
"""How soon a claim that left due timers below the other shards' floor claims again, when
nothing wakes it first (a timer moving in, a wake): the floor rises as the other shards'
earlier timers enter their limits' order."""
GATHER_S = 0.002
"""How long a claim in a backlog waits for slots to free while the process is busy
(:meth:`Claimer.gather_slots`)."""
BUSY_WINDOW = 0.05
"""Seconds of CPU time :class:`CpuGauge` looks back on."""
BUSY_SHARE = 0.8
"""The share of a core above which the process counts as busy (its Python runs on one)."""


DECLARE_WINDOW = 100
"""``lua/declare.lua``'s window: a claim that declares its keys asks for those of up to
twice its limit of due timers and this many more."""


class KnownKeys:
    """Where scripts declare their keys (Redis Cluster, ``TIMERS_DECLARE_KEYS=1``): the
    keys a lane's claims asked for (``Declaring.last_asked``), passed with its next claim,
    so that a claim asks for none again and is one call, not two: the expiring keys of the
    due timers ahead (a window of its due index), a group's due index and running set, an
    order barrier. A claim still asks when a timer it may take now, or any other key it
    needs, was not given (``claim.lua``'s declare part): a key it touches is always one it
    was given. The keys of the timers this lane claimed are dropped, and past
    :attr:`cap` keys the oldest asked for (they were asked in due order, so those are the
    timers other listeners took)."""

    def __init__(self) -> None:
        self.keys: dict[str, None] = {}
        self.cap = self.most(0)
        """How many are kept: :meth:`most` of the last claim that asked (a claim of fewer
        timers after it still needs the window that one asked for)."""

    @staticmethod
    def most(limit: int) -> int:
        """How many keys are kept after a claim of ``limit`` asked: its window and the
        timers of one claim more (every key is sent with each claim)."""
        return 3 * limit + DECLARE_WINDOW

    def learn(self, asked: Sequence[object], key_start: str, runs: Sequence[Run],
              limit: int) -> None:
        """After a claim of ``limit`` that asked for ``asked`` and took ``runs``."""
        keys = self.keys
        if asked:
            self.cap = self.most(limit)
        for key in asked:
            try:
                text = key.decode() if isinstance(key, bytes) else str(key)
            except UnicodeDecodeError:
                continue  # asked again when needed
            keys.pop(text, None)
            keys[text] = None
        for run in runs:
            keys.pop(f"{key_start}{run.escaped_id}:{run.record_text}", None)
        over = len(keys) - self.cap
        if over > 0:
            for key in list(keys)[:over]:
                del keys[key]


class CpuGauge:
    """Whether this process used most of a core over the last :data:`BUSY_WINDOW`
    seconds (the event loop's CPU time with its threads'), read at most that often."""

    def __init__(self, cpu: Callable[[], float] = time.process_time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.cpu, self.monotonic = cpu, monotonic
        self._at, self._used = monotonic(), cpu()
        self._busy = False

    def busy(self) -> bool:
        """True while the process's CPU, rather than what its tasks wait on, bounds its
        runs."""
        now = self.monotonic()
        if now - self._at >= BUSY_WINDOW:
            used = self.cpu()
            self._busy = used - self._used >= BUSY_SHARE * (now - self._at)
            self._at, self._used = now, used
        return self._busy


async def wait_for_slots(free_slots: Callable[[], int], want: int, freed: asyncio.Event,
                         stopping: asyncio.Event, monotonic: Callable[[], float],
                         most: float = GATHER_S) -> None:
    """Return once ``want`` slots are free (``freed`` is set as each frees), after
    ``most`` seconds, or on stop, whichever comes first."""
    end = monotonic() + most
    while free_slots() < want and not stopping.is_set():
        left = end - monotonic()
        if left <= 0:
            return
        freed.clear()
        await pause(left, freed)


@dataclass(frozen=True)
class ClaimerHooks:
    """What the claimer asks of the rest of the listener."""

    free_slots: Callable[[], int]
    """Runs it may start now."""
    take_event_ids: Callable[[int], list[str]]
    """Up to n escaped ids events named, to claim first."""
    busy: Callable[[], bool]
    """Runs going or event ids waiting (a burst is not over)."""
    start: Callable[[Run], None]
    """Start one claimed run."""
    give_up: Callable[[BaseException], None]
    """A permanent error: stop the listener."""
    keyed_tasks: Callable[[], Sequence[str]]
    """The tasks with a concurrency key or cap (claims note theirs for the order barrier)."""
    place: Callable[[list[Run]], Awaitable[list[Run]]] | None = None
    """On a prefix of several shards: moves the claimed runs whose limit lives in another
    shard there and returns those that stay (:mod:`timers.listener.flow.placer`)."""
    floor: Callable[[Sequence[str], Sequence[str]], Awaitable[int]] | None = None
    """On a prefix of several shards: the other shards' floor for the keyed tasks' timers
    (:meth:`timers.listener.flow.placer.Placer.floor`), sent with each claim."""


def _keyed_without_key(run: Run, keyed: Sequence[str]) -> bool:
    task, options = record_head(run.record_text)
    return task in keyed and not (options and record_option(run.record_text, Option.KEY))


class Claimer:
    """Claims due timers for one listener; :meth:`run` is its sweep loop.

    ``poke``: set to sweep now (an event, a wake, a freed slot in a burst, stop).
    ``parker``: parks the due backlog that flow limits hold back. ``ahead_share``: the most
    a claim ahead of the due time takes (half the listener's slots): the listeners that
    wake for one burst each take a share of its first timers. Under keys, each keeps the
    keys of the runs it starts (their next runs are handed to it), so one listener taking
    all its slots' worth would run most keys alone. ``outage``: shared with the lane's
    other loops. ``gather``: the free slots a claim in a backlog waits for while the
    process is busy (:meth:`gather_slots`), as ``gauge`` tells (the listener's)."""

    def __init__(self, scripts: Scripts, groups: Sequence[str], listener_id: str,
                 lease: float, clock: Clock, tracker: DueTracker, hooks: ClaimerHooks,
                 stopping: asyncio.Event, *, poke: asyncio.Event, parker: Parker,
                 ahead_share: int, outage: Outage, gather: int = 1,
                 gauge: CpuGauge | None = None) -> None:
        self.scripts, self.groups, self.listener_id = scripts, tuple(groups), listener_id
        self.lease, self.clock, self.tracker = lease, clock, tracker
        self.hooks, self.stopping = hooks, stopping
        self.poke, self.parker, self.ahead_share, self.outage = poke, parker, ahead_share, outage
        self.gather, self.gauge = gather, gauge or CpuGauge()
        self.memory, self.replicas = MemoryGuard(), ReplicaGuard()
        self.swept = False
        """A claim was answered: what is due is known."""
        self.below_floor = False
        """The last claim left due timers that wait for the other shards' floor."""
        self.keyed_due = False
        """On several shards: the last claim met a keyed task's timer without a key of its
        own (claimed, or held back): the next one asks the other shards for their floor.
        Until then a claim is sent with a floor of 0, which holds every such timer back
        and costs no round trip more; meeting one, the lane claims again at once."""
        self.slot_freed = asyncio.Event()
        self.known = KnownKeys()
        """The keys passed with each claim where scripts declare theirs."""

    async def run(self, burst: bool) -> None:
        """Claim as timers come due until stopped (``burst``: until nothing is due)."""
        retry = Retry(self.poke, "claims", self.outage)
        while not self.stopping.is_set():
            if self.hooks.free_slots() <= 0:
                self.slot_freed.clear()
                await self._park_backlog()  # while its claims' gates are under way
                await self.slot_freed.wait()
                await self._until_something_is_due()
                continue
            if (self.tracker.backlogged and self.hooks.free_slots() < self.gather
                    and self.gauge.busy()):
                await self.gather_slots()
            self.poke.clear()
            # (another lane may have taken the slots meanwhile: free_slots counts theirs)
            limit = min(self.hooks.free_slots(), MAX_BATCH,
                        self.ahead_share if self._claiming_ahead() else MAX_BATCH)
            if limit <= 0:
                continue
            try:
                if not await self.replicas.ready(self.stopping):
                    break
                claimed = await self.claim(limit)
            except redis.exceptions.OutOfMemoryError as exc:
                await pause(self.memory.refused(exc), self.stopping)
                continue
            except RETRYABLE as exc:
                if is_permanent(exc):
                    self.hooks.give_up(exc)
                    break
                await retry.failed(exc)
                continue
            retry.ok()
            self.swept = True
            self.memory.claimed()
            if claimed >= limit:
                continue
            if burst and self.idle():
                break
            delay = self.tracker.seconds_until_next()
            if self.below_floor:
                delay = max(delay, FLOOR_RETRY_S)
            await pause(max(delay, 0.0005) if claimed == 0 else delay, self.poke)

    async def gather_slots(self) -> None:
        """Wait up to :data:`GATHER_S` for :attr:`gather` slots to be free, so that one
        claim takes several timers. Only in a backlog (more is due than there are slots)
        and while the process is busy: a claim's fixed cost (the script call in Redis,
        and the listener's round trip) is then what slows the runs, and a slot left free
        a moment costs next to nothing (its run would wait for the CPU). Plain
        functions' runs end one by one in their threads: claiming for each slot as it
        freed made claims of 2 or 3 timers, and at times (a listener and its threads
        trading the interpreter run for run) cost the fires much of their speed. A
        listener whose tasks wait (on the network, a sleep) is not busy: it claims for
        each slot at once, as a wait would leave slots idle for a share of each run
        (figures: bench/FINDINGS.md, "Fixed costs of claims and finish calls")."""
        await wait_for_slots(self.hooks.free_slots, self.gather, self.slot_freed,
                             self.stopping, self.clock.monotonic)

    def _claiming_ahead(self) -> bool:
        """Whether the earliest timer known is not due yet (the claim takes it early)."""
        head = self.tracker.next_due_ms
        return head is not None and head > self.tracker.redis_now_ms()

    async def _park_backlog(self) -> None:
        """While due timers remain that flow limits hold back, park them without claiming
        (see :mod:`timers.listener.flow.parker`); a failure leaves them to the claims."""
        passes = 0
        while (self.tracker.backlogged and self.parker.wanted()
               and passes < PARK_PASSES and not self.stopping.is_set()):
            passes += 1
            try:
                if not await self.parker.park_backlog():
                    return
            except RETRYABLE as exc:
                log.debug("parking skipped: %s", exc)
                return

    async def _until_something_is_due(self) -> None:
        """After a slot frees, claim only when a timer is due (or an event or a wake came):
        a listener at its concurrency would otherwise send a claim, finding nothing, each
        time one of its runs ends."""
        delay = self.tracker.seconds_until_next()
        if delay > 0 and not self.poke.is_set():
            await pause(delay, self.poke)

    def idle(self) -> bool:
        """Nothing running, nothing named by events, nothing due yet."""
        if self.hooks.busy():
            return False
        return self.nothing_due()

    def nothing_due(self) -> bool:
        """Nothing due yet, as far as this claimer knows (it knows nothing before its
        first claim)."""
        if not self.swept:
            return False
        head = self.tracker.next_wake_ms()
        return head is None or head > self.tracker.redis_now_ms()

    async def claim(self, limit: int) -> int:
        """Claim up to ``limit`` timers and start those still held; how many were claimed."""
        keyed = self.hooks.keyed_tasks()
        floor: int | None = None
        asked = False
        if keyed and self.hooks.floor is not None:  # several shards (Cluster rule 5)
            asked = self.keyed_due
            floor = await self.hooks.floor(self.groups, keyed) if asked else 0
        ids = self.hooks.take_event_ids(limit)
        script = self.scripts.script("claim")
        declaring = getattr(script, "last_asked", None) is not None
        sent = self.clock.monotonic()
        reply = await self.scripts.claim(
            limit=limit, lease_ms=round(self.lease * 1000), horizon_ms=_HORIZON_MS,
            listener_id=self.listener_id, event_ids=ids, groups=self.groups,
            keyed_tasks=keyed, floor=floor,
            known_keys=tuple(self.known.keys) if declaring else ())
        now_us, next_due = self._observe(reply, script, sent)
        items = reply[3:]
        runs = [Run.parse(items[i], items[i + 1], items[i + 2]) for i in range(0, len(items), 3)]
        if declaring:
            self.known.learn(script.last_asked, self.scripts.calls.keys.timer_key_start,
                             runs, limit)
        if floor is not None:
            held = len(runs) < limit and floor < next_due <= now_us // 1000
            self.below_floor = held and asked
            self.keyed_due = held or any(_keyed_without_key(run, keyed) for run in runs)
        for run in await self._to_start(runs, reply, sent):
            self.hooks.start(run)
        return len(items) // 3

    def _observe(self, reply: list[Any], script: object, sent: float) -> tuple[int, int]:
        """What a claim's reply says of the Redis clock and of the heads of the due and
        running sets, told to the tracker; the reply's Redis time (µs) and next due (ms)."""
        received = self.clock.monotonic()
        now_us, next_due, next_lease = (int(x) for x in reply[:3])
        # a claim that asked for keys (Redis Cluster) was sent more than once: the Redis
        # clock in its reply, read in the last round trip, is no sample of the whole
        if getattr(script, "last_calls", 1) == 1 or not self.tracker.knows_clock:
            self.tracker.observe_time(now_us, sent, received)
        self.tracker.observe_heads(
            None if next_due == -1 else next_due, None if next_lease == -1 else next_lease
        )
        self.tracker.backlogged = next_due != -1 and next_due <= now_us // 1000 + _HORIZON_MS
        return now_us, next_due

    async def _to_start(self, runs: list[Run], reply: list[Any], sent: float) -> list[Run]:
        """The claimed ``runs`` to start here: none when the claim may not have reached a
        replica; placed on their shard's worker; screened by the flow gates that hold runs
        back; and, when the reply (or the screen) was read past half a lease, only those
        still held."""
        if isinstance(reply, UnreplicatedReply):
            self.replicas.fell_short(reply, len(runs))
            return []
        if runs and self.hooks.place is not None:
            runs = await self.hooks.place(runs)
        if runs and self.parker.wanted():
            # gates hold runs back (a backlog for busy keys): those held back now are not
            # started at all. Otherwise each run asks at its start, and the next claim
            # goes out meanwhile.
            runs = await self.parker.flow.screen(runs, self.parker.resolve)
        waited = self.clock.monotonic() - sent  # the reply, or the screen, read late
        if runs and waited > self.lease / 2:
            runs = await still_held(self.scripts, round(self.lease * 1000), runs, waited,
                                    "claim")
        return runs
