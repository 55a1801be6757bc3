"""A listener's lanes: one per shard of the prefix (see :mod:`timers.ops.shards`).

Every listener serves every shard, with no leader: a :class:`Lane` has the shard's own
claims and due-driven sweep, event subscription (on the node that holds the shard, since
a cluster's ``expired`` events are node-local), wake channel, endings, leases, near keys
and heartbeat, and runs the timers it claims. The lanes of a listener share a
:class:`~timers.listener.shared.Shared`: one runner (``--concurrency`` counts the runs of
every lane), the tasks, the stop and abort flags, the tally and the recycler. With one
shard the listener has one lane.

A lane's way out (:meth:`Lane.serve`'s end): its running tasks get ``shutdown_timeout``
seconds, the rest are handed back, and its loops end after the endings already on their
way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.listener.cron_hook import RecurrenceHook
from timers.listener.endings.adoption import DeadJournal
from timers.listener.endings.ending import Ending
from timers.listener.endings.history import HistoryTrimmer
from timers.listener.endings.journal import Journal
from timers.listener.endings.writer import EndingWriter
from timers.listener.executor import Executor
from timers.listener.finding.claimer import Claimer, ClaimerHooks
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.finding.events import Channels, EventHub, EventSource
from timers.listener.finding.near_keys import keep_near_keys
from timers.listener.finding.rejected import RejectedKeys
from timers.listener.flow.gate import FlowGate
from timers.listener.flow.handoff import Handoff
from timers.listener.flow.parker import Parker
from timers.listener.flow.placer import Placer
from timers.listener.flow.turns import Turns
from timers.listener.health.heartbeat import Heartbeat
from timers.listener.leases import Fence, HeldRuns, LeaseKeeper, renewal_timeout, sync_twin
from timers.listener.quarantine.crashes import listener_name
from timers.listener.quarantine.parent import Quarantine
from timers.listener.retrying import RETRYABLE, Outage, beat_until
from timers.listener.shared import Shared
from timers.model.encoding import unescape_id
from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.model.wire import HEARTBEAT_INTERVAL, ClaimSource
from timers.ops.shards import ShardLayout
from timers.store.permissions import explain
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")

FLUSH_GRACE = 5.0  # s a batch of endings already sent may take to be answered at shutdown
_RECOVERED = ClaimSource.RECOVERED.label
HAND_BACK_GRACE_MS = 1000
"""A run handed back at the end may still be going in its thread until the process exits
(a thread cannot be stopped): a concurrency key slot it holds stays held this long, and
its timer comes due again then, so the key never runs two at once (``finish.lua``)."""


class Lane:
    """One shard's work in a listener: claims, events, gates, runs, endings, leases,
    heartbeat. ``announces``: its heartbeat carries the listener's task list as
    :class:`Peers` tracks it (the listener's only lane; with several shards, each lane
    sends the list with every heartbeat). ``hub``: the lanes' one subscription per node
    (the only lane's: a hub of one); ``shards``: how many lanes there are. ``subscribed``:
    the event its subscription sets (the listener's own, for the first lane)."""

    def __init__(self, shared: Shared[Lane], keys: Keyspace, index: int, *, announces: bool,
                 hub: EventHub, shards: int = 1, subscribed: asyncio.Event | None = None) -> None:
        self.shared, self.keys, self.index, self.announces = shared, keys, index, announces
        # the shared parts each run uses, one attribute away
        self.lanes, self.runner, self.tally = shared.lanes, shared.runner, shared.tally
        self.recycler, self.burst = shared.recycler, False
        self.scripts = Scripts(shared.redis, keys)
        shared.reserve(self.scripts, "claim", "finish")
        self.tracker = DueTracker(shared.clock, max_sleep=shared.max_sleep)
        self.closed = asyncio.Event()  # running tasks are done: stop renewing leases too
        self.stopping = asyncio.Event()  # this lane's loops end (all lanes' on stop)
        self.running: dict[str, Run] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}  # each running run's, by its token
        self.held = HeldRuns(shared.lease)  # tokens whose lease we keep: running or unflushed
        self.turns = Turns()  # runs next in line on a key slot, and those they follow
        loader, outage, poke = shared.loader, Outage(), asyncio.Event()
        self.flow = FlowGate(self.scripts, shared.lease, on_held=shared.tally.held_back,
                             shards=shards, shard=index, window=shared.rate_start_window,
                             held=self.held)
        self.placer = (Placer(lambda i: self.lanes[i].scripts, index, shards, shared.lease,
                              loader.resolve, hand_back=self.hand_back_now,
                              redis_now_ms=self.tracker.redis_now_ms, arrived=self._arrived)
                       if shards > 1 else None)
        """Moves runs whose limit lives in another shard there (several shards only)."""
        self.handoff = Handoff(shared.id, shared.groups, shared.lease, shared.free_slots,
                               shared.stopping, self.start, self.hand_back_now,
                               slot_freed=shared.slot_freed, holding=self.flow.holding)
        self.endings = EndingWriter(self.scripts, keys, shared.failure_retention, self.held,
                                    self.closed, shared.clock, taker=self.handoff.taker,
                                    on_handed=self.handoff.handed,
                                    on_written=self._after_endings_written, outage=outage,
                                    history=shared.history, listener_id=shared.id,
                                    task_retention=loader.history_retention)
        self.trimmer = HistoryTrimmer(self.scripts, shared.history, self.closed, outage)
        self.rejected = RejectedKeys(shared.peers, keys, self.tracker, self.endings,
                                     shared.tally.rejected)
        self.events = EventSource(shared.redis, Channels.of(keys, shared.db, shared.groups),
                                  keys, loader.resolve, self.tracker, poke.set,
                                  self.rejected.reject, self.stopping, outage=outage, hub=hub,
                                  subscribed=subscribed)
        self.claimer = self._claimer(poke, outage)
        self.executor = self._executor()
        self.heartbeat = Heartbeat(shared, self.scripts, self.tracker, index,
                                   announces=announces)

        self.journal: Journal | None = None

    def _claimer(self, poke: asyncio.Event, outage: Outage) -> Claimer:
        """The shard's sweep loop and claim, with what this lane starts, parks and moves."""
        shared, loader = self.shared, self.shared.loader
        return Claimer(
            self.scripts, shared.groups, shared.id, shared.lease, shared.clock, self.tracker,
            ClaimerHooks(free_slots=shared.free_slots, take_event_ids=self.events.take,
                         busy=self.busy, start=self.start, give_up=self._give_up,
                         keyed_tasks=loader.keyed_tasks,
                         place=None if self.placer is None else self.placer.place,
                         floor=None if self.placer is None else self.placer.floor),
            shared.stopping, poke=poke,
            parker=Parker(self.scripts, shared.groups, shared.lease, loader.resolve, self.flow,
                          moves=None if self.placer is None else self.placer.not_parked),
            ahead_share=max(1, shared.concurrency // 2), outage=outage,
            gather=max(1, shared.concurrency // 4), gauge=shared.cpu)

    def _executor(self) -> Executor:
        """What runs this lane's claimed timers, each through its checks and gate, a
        suspect one in quarantine."""
        shared, loader, keys = self.shared, self.shared.loader, self.keys
        return Executor(loader.resolve, shared.runner,
                        Quarantine(loader, listener_name(shared.id), self.held),
                        RecurrenceHook(shared.redis, keys, self.scripts), self.tracker,
                        shared.precise, flow=self.flow,
                        name=f"listener {shared.id} (package {loader.package!r}, "
                             f"groups {', '.join(shared.groups)})",
                        turns=self.turns, fence=Fence(self.held, self.scripts, shared.lease),
                        peers=shared.peers, stopping=shared.stopping)

    def use_journal(self, journal: Journal | None) -> None:
        """Keep this lane's endings in ``journal`` (:mod:`timers.listener.endings.journal`)."""
        self.journal = self.endings.journal = journal
        self.endings.lane = self.index
        index = self.index
        self.executor.note = (None if journal is None
                              else lambda run: journal.note(index, run))
        self.executor.quarantined.aside = (None if journal is None
                                           else lambda run: journal.aside(index, run))

    async def replay(self, dead: DeadJournal) -> int:
        """Queue the endings of ``dead``'s journal in this lane whose runs its listener
        still held (their leases kept meanwhile): how many."""
        tokens = dead.tokens(self.index)
        if not tokens:
            return 0
        records = await self.shared.redis.hmget(self.keys.running_records, tokens)
        endings = dead.held_by_owner(self.index, list(records))
        for ending in endings:
            self.held.hold(ending.token, _timer_of(ending))
            self.endings.add(ending)
        return len(endings)

    # -- serving ----------------------------------------------------------------------

    async def serve(self, events: bool) -> None:
        """Claim, run and finish this shard's timers until the listener stops (or, in a
        burst, nothing is due); then wait for its runs, hand back the rest, end its loops."""
        shared = self.shared
        self.burst = shared.burst
        keeper = LeaseKeeper(sync_twin(shared.redis, renewal_timeout(shared.lease)),
                             self.keys, shared.lease, self.held).start()
        loops = [
            asyncio.create_task(self.events.run() if events else self.events.run_without(),
                                name="timers-events"),
            asyncio.create_task(self.endings.run(), name="timers-finish"),
            asyncio.create_task(self.trimmer.run(), name="timers-history-trim"),
            asyncio.create_task(self._heartbeat_loop(), name="timers-heartbeat"),
        ]
        if self.placer is not None:
            loops.append(asyncio.create_task(
                self.placer.settle_lapsed_until(self.stopping), name="timers-arrivals"))
        for loop_task in loops:
            loop_task.add_done_callback(self._loop_ended)
        try:
            await self.claimer.run(self.burst)
        except BaseException:
            shared.stopping.set()  # every lane stops: a shard left unserved must not hang
            raise  # a burst, or go unnoticed
        finally:
            self.stopping.set()  # this lane's events, heartbeat and near keys
            if not self.burst or len(self.lanes) == 1:
                shared.stopping.set()  # (a burst's lanes end each when its shard is done)
            await self.drain()
            self.closed.set()
            await asyncio.to_thread(keeper.close)
            await self._end_loops(loops)
            await self.endings.flush_remaining(shared.clock)
            await self.trimmer.settle(shared.clock)
            with contextlib.suppress(*RETRYABLE):
                await self.heartbeat.beat(alive=False)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A loop must only end on stop: if one dies of a bug, stop rather than limp on
        (``--processes`` restarts the listener; alone, it exits nonzero)."""
        if task.cancelled() or self.closed.is_set():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("%s loop died: %r; stopping the listener", task.get_name(), exc,
                         exc_info=exc)
            self.shared.crashed = True
            self.shared.abort()

    def _give_up(self, exc: BaseException) -> None:
        """A permanent error (:func:`~timers.store.permissions.is_permanent`): stop."""
        log.error("cannot claim timers: %s; stopping", explain(exc, self.keys))
        self.shared.crashed = True
        self.shared.stop()

    async def drain(self) -> None:
        """Wait for running tasks, then hand back the runs that did not finish."""
        shared = self.shared
        running = [t for t in self.tasks.values() if not t.done()]
        await self.recycler.wait_for_runs(running, lambda: self.heartbeat.beat(alive=True))
        running = [t for t in running if not t.done()]
        if running and not shared.aborting.is_set():
            log.info("waiting up to %gs for %d running task(s)", shared.shutdown_timeout,
                     len(running))
            waiter = asyncio.create_task(shared.aborting.wait())
            everything: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
            either: list[asyncio.Future[Any]] = [everything, waiter]
            await asyncio.wait(either, timeout=shared.shutdown_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        journal = shared.journal
        unfinished = []
        for run in list(self.running.values()):
            self.running.pop(run.token, None)
            if journal is not None and journal.completed(run.token):
                # its function returned, the loop has not seen it yet: the journal keeps
                # its ending for a listener of this host to write (handed back, it ran
                # again: the chaos checker's Cluster run, a listener stopping on an error)
                continue
            unfinished.append(run)
            self.endings.add(Ending.release(run.token, HAND_BACK_GRACE_MS))
        for task in self.tasks.values():
            task.cancel()
        if unfinished:
            self.tally.hand_back([run.timer_id for run in unfinished])

    async def _end_loops(self, loops: list[asyncio.Task[None]]) -> None:
        """Cancel the loops, but let a batch of endings on its way finish first: a write
        cancelled after Redis ran it would be sent again and count as late finishes."""
        writers = [t for t in loops if t.get_name() == "timers-finish"]
        self.endings.ready.set()  # the writer sees the close flag and ends after its batch
        await asyncio.wait(writers, timeout=FLUSH_GRACE)
        for loop_task in loops:
            loop_task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    # -- runs -------------------------------------------------------------------------

    def hand_back_now(self, run: Run) -> None:
        self.held.hold(run.token, run.timer_id)
        self.endings.add(Ending.release(run.token))

    def start(self, run: Run) -> None:
        self.held.hold(run.token, run.timer_id)
        if (run.source == _RECOVERED or run.reruns) and self.endings.ended_before(run):
            return  # a rerun whose cut run had ended: ended the same way
        if not self.running:
            self.shared.work_started()
        self.running[run.token] = run
        self.turns.start(run)
        # (_run_one takes its task out of the set as it ends: a done callback would cost
        # each run one more turn of the event loop; the loop's own create_task: no name
        # to set, one Python frame less per run)
        self.tasks[run.token] = asyncio.get_running_loop().create_task(self._run_one(run))

    def _after_endings_written(self) -> None:
        self.trimmer.written()
        if self.burst:
            self._poke_bursts()  # the sweep loop decides whether the burst is over

    def _poke_bursts(self) -> None:
        """In a burst, this lane's sweep loop looks again whether the burst is over; with
        several shards, every lane's (a lane's burst ends only with all of theirs: a timer
        claimed in one may move into another, :mod:`timers.listener.flow.placer`)."""
        for lane in self.lanes if self.placer is not None else (self,):
            lane.claimer.poke.set()

    def busy(self) -> bool:
        """Runs going, events waiting, or endings not written yet (a retry due at once is
        due only once its ending is written: a burst is not over before then). With
        several shards, in a burst: or another lane has any of those, a move under way or
        something due (a timer it claims may move into this lane's shard)."""
        if self._busy_here():
            return True
        return self.burst and self.placer is not None and any(
            lane._busy_here() or not lane.claimer.nothing_due()
            for lane in self.lanes if lane is not self)

    def _busy_here(self) -> bool:
        return bool(self.running or self.events.pending or len(self.endings)
                    or (self.placer is not None and self.placer.in_flight))

    def _arrived(self, target: int, due_ms: int) -> None:
        """A timer moved into shard ``target``: its lane claims it when it is due."""
        lane = self.lanes[target]
        lane.tracker.note_due(due_ms)
        lane.claimer.poke.set()

    async def _run_one(self, run: Run) -> None:
        try:
            done = await self.executor.execute(run)
        except asyncio.CancelledError:
            return  # shutting down: drain hands this run back
        finally:
            token = run.token
            self.tasks.pop(token, None)
            self.running.pop(token, None)
            self.turns.end(token)
            self.shared.slot_freed()
            if self.burst:
                self._poke_bursts()  # the sweep loop decides whether the burst is over
        self.tally.ended(done)
        if done.ending is None:  # held back by a flow gate: the run is no longer ours
            self.held.release([run.token])
            self.flow.holding.discard(run.token)  # (taken over: its slot is not ours)
            return
        self.endings.add(done.ending, done.facts, done.prompt)
        if done.report is not None:
            self.shared.reported(done.report)

    # -- heartbeat --------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """The heartbeat, and the near keys alongside (a turn every few seconds each)."""
        await asyncio.gather(
            beat_until(self.stopping, lambda: self.heartbeat.beat(alive=True),
                       HEARTBEAT_INTERVAL),
            keep_near_keys(self.scripts, self.stopping))


def lanes_for(shared: Shared[Lane], layout: ShardLayout, subscribed: asyncio.Event) -> list[Lane]:
    """A lane per shard of ``layout`` (of several), with one subscription per node."""
    hub: EventHub = EventHub()
    return [Lane(shared, keys, index, announces=False, shards=layout.count, hub=hub,
                 subscribed=subscribed if index == 0 else None)
            for index, keys in enumerate(layout.keyspaces)]


def shard_note(lanes: Sequence[Lane]) -> str:
    """For the start-up line: ``" over 16 shards"`` when there are several."""
    return f" over {len(lanes)} shards" if len(lanes) > 1 else ""


def _timer_of(ending: Ending) -> str:
    """The timer id of a journaled ending, for the log (its token when it has none)."""
    if ending.run_of is not None:
        with contextlib.suppress(MalformedTimerKey):
            return unescape_id(ending.run_of[0])
    return f"(run {ending.token})"
