"""The listener: finds due timers, claims them, runs them, records how they ended.

It wires parts with one job each, sharing one asyncio event loop:

- **events** (:mod:`timers.listener.events`): the ``expired`` events and wake messages;
  each names a timer for the next claim, moves the next due time, or is rejected.
- **claimer** (:mod:`timers.listener.claimer`): the due-driven sweep loop and the claim.
- **executor** (:mod:`timers.listener.executor`): runs one claimed timer, returns its
  :class:`Ending`.
- **endings** (:mod:`timers.listener.endings`): writes endings in batches.
- **leases** (a thread: :mod:`timers.listener.leases`, so a blocked loop cannot starve
  it): keeps a live listener's timers; a dead one's run again once their lease lapses.

This module keeps the lifecycle: start, one lane per shard (:mod:`timers.listener.lanes`),
a heartbeat so ``timers listeners`` shows who is alive, the near keys, and stop
(:mod:`timers.listener.shutdown`): running tasks get ``shutdown_timeout`` seconds, the
unfinished runs go back to the due index so another listener runs them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio

from timers.clock import Clock, SystemClock
from timers.cluster import database_of, keyspace_for
from timers.cron import RecurrenceHook
from timers.keys import configured_prefix
from timers.listener.claimer import Claimer, ClaimerHooks
from timers.listener.connection import check_limits, client_of
from timers.listener.crashes import listener_name
from timers.listener.due_tracker import DueTracker
from timers.listener.endings import Ending, EndingWriter
from timers.listener.events import Channels, EventSource, Rejected
from timers.listener.executor import Executed, Executor
from timers.listener.flow_gate import FlowGate
from timers.listener.groups import served_groups
from timers.listener.handoff import Handoff
from timers.listener.history import HistoryPolicy
from timers.listener.info import heartbeat
from timers.listener.lanes import shard_note
from timers.listener.leases import Fence, HeldRuns, LeaseKeeper, sync_twin
from timers.listener.loop_watch import LoopWatch
from timers.listener.near_keys import keep_near_keys
from timers.listener.parker import Parker
from timers.listener.peers import Peers
from timers.listener.permissions import explain
from timers.listener.precise import PreciseSleeper
from timers.listener.preflight import preflight
from timers.listener.quarantine import Quarantine, prestart
from timers.listener.recycling import RecycleLimits, Recycler, report_fd
from timers.listener.retrying import RETRYABLE, Outage, beat_until
from timers.listener.runner import Runner
from timers.listener.shutdown import drain, end_loops
from timers.listener.tally import RunTally
from timers.listener.turns import Turns
from timers.loader import TASKS_ENV, TaskLoader, configured_package
from timers.runs import Fired, Run, rejected_entry
from timers.scripts import Scripts
from timers.shards import configured_shards
from timers.wire import HEARTBEAT_INTERVAL, ClaimSource, EndingKind

log = logging.getLogger("timers.listener")
QUARANTINE_AHEAD_DELAY = 3.0
"""Seconds after start-up that ``timers listen`` starts quarantine's process (at most half
a lease)."""

DEFAULT_LEASE = 15.0
DEFAULT_CONCURRENCY = 32
DEFAULT_FAILURE_RETENTION = 7 * 86400.0


class Listener:
    """Runs timers as they come due. Start it with ``await listener.run()``.

    ``redis_`` is a URL or a ``redis.asyncio.Redis`` that returns bytes (the listener reads
    key names that may not be UTF-8). ``tasks`` is the package whose functions may run
    (default ``$TIMERS_TASKS`` or ``tasks``, found on ``PYTHONPATH`` first, then in
    ``search_path``, by default the working directory); ``registry`` adds callables by
    explicit name. ``shards``: as for :class:`timers.Timers` (it serves every shard).
    ``quarantine_ahead``: start the process quarantine children fork from at start-up
    (``timers listen`` does), not at the first rerun after a listener died. ``history``:
    how long ended timers' records are kept and whether per-task series are written
    (default: 7 days, 100,000 records per shard, series on).
    """

    def __init__(
        self,
        redis_: str | redis.asyncio.Redis | None = None,
        *,
        prefix: str | None = None,
        tasks: str | None = None,
        registry: Mapping[str, Callable[..., Any]] | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float = DEFAULT_LEASE,
        failure_retention: float = DEFAULT_FAILURE_RETENTION,
        max_sleep: float = 60.0,
        shutdown_timeout: float = 30.0,
        clock: Clock | None = None,
        observer: Callable[[Fired], None] | None = None,
        search_path: str | None = None,
        allow_eviction: bool = False,
        recycle: RecycleLimits | None = None,
        groups: Sequence[str] | None = None,
        shards: int | None = None,
        quarantine_ahead: bool = False,
        history: HistoryPolicy | None = None,
    ) -> None:
        check_limits(concurrency, lease)
        self.shards, self.groups = configured_shards(shards), served_groups(groups)
        self.redis, self._owns_client = client_of(redis_)
        self.prefix = configured_prefix(prefix)
        self.keys, self.db = keyspace_for(self.redis, prefix), database_of(self.redis)
        self._tasks_optional = bool(registry) and tasks is None and not os.environ.get(TASKS_ENV)
        self.loader = TaskLoader(configured_package(tasks), registry,
                                 os.getcwd() if search_path is None else search_path)
        self.concurrency, self.lease, self.shutdown_timeout = concurrency, lease, shutdown_timeout
        self.failure_retention = failure_retention
        self.history = HistoryPolicy() if history is None else history
        """What the run history and the series keep (:mod:`timers.listener.history`)."""
        self.clock = clock or SystemClock()
        self.tracker = DueTracker(self.clock, max_sleep=max_sleep)
        self.observer, self.allow_eviction = observer, allow_eviction
        self.quarantine_ahead = quarantine_ahead
        self._forkserver: asyncio.Task[None] | None = None
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.started_at, self.ended_count = time.time(), 0
        """Runs this listener ended, however they ended (Stats.fired counts the good)."""
        self.crashed = False
        """A loop died of a bug or a permanent error stopped it: exit nonzero."""
        self.tally = RunTally()
        """How runs ended, for the log (``tally.log_fires``: a line per fired timer)."""
        self._scripts = Scripts(self.redis, self.keys)
        self.peers = Peers.over(self.redis, self.keys, self.id, self.loader.package,
                                self.loader.task_names)
        """The other live listeners of the prefix and what they run (:mod:`timers.fleet`)."""
        self._stopping = asyncio.Event()  # stop claiming
        self._abort_event, self._burst = asyncio.Event(), False
        self._new_lane_state()
        self.recycler = Recycler(recycle, self._stop_claiming, report_fd())
        self._root, self._lanes, self.shard_index = self, [self], 0  # see listener/lanes.py
        self._runner = Runner(self.concurrency, on_free=self._slot_freed_everywhere)
        self._precise = PreciseSleeper()
        self._wire_parts()

    def _new_lane_state(self) -> None:
        """What each lane keeps of its own runs (see :mod:`timers.listener.lanes`)."""
        self._closed = asyncio.Event()  # running tasks are done: stop renewing leases too
        self._lane_stopping = asyncio.Event()  # this lane's loops end (all lanes' on stop)
        self._running: dict[str, Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._held = HeldRuns(self.lease)  # tokens whose lease we keep: running or unflushed
        self.turns = Turns()  # runs next in line on a key slot, and those they follow
        self.task_list_sent = False  # this lane's heartbeat stored the task list
        self._rejecting: set[asyncio.Task[None]] = set()  # expired keys checked with peers

    def _wire_parts(self) -> None:
        """The parts of one shard's lane: its claims, events, endings and gates."""
        self.endings = EndingWriter(self._scripts, self.keys, self.failure_retention,
                                    self._held, self._closed, self.clock, self.history,
                                    self.id)
        self.endings.on_written = self._after_endings_written
        self.handoff = Handoff(self.id, self.groups, self.lease, self._free_slots,
                               self._stopping, self._start, self._hand_back_now)
        self.flow = FlowGate(self._scripts, self.lease)
        self.handoff.holding = self.flow.holding
        self.endings.taker, self.endings.on_handed = self.handoff.taker, self.handoff.handed
        self.claimer = Claimer(self._scripts, self.groups, self.id, self.lease, self.clock,
                               self.tracker, ClaimerHooks(
                                   free_slots=self._free_slots,
                                   take_event_ids=lambda n: self.events.take(n),
                                   busy=self._busy, start=self._start, give_up=self._give_up,
                                   keyed_tasks=self.loader.keyed_tasks),
                               self._stopping)
        self.claimer.ahead_share = max(1, self.concurrency // 2)
        self.events = EventSource(self.redis, Channels.of(self.keys, self.db, self.groups),
                                  self.keys, self.loader.resolve, self.tracker,
                                  self.claimer.poke.set, self._reject, self._lane_stopping)
        self.claimer.parker = Parker(self._scripts, self.groups, self.lease, self.loader.resolve,
                                     self.flow)
        self.flow.on_held = lambda count: self.tally.held_back(count)
        self.events.on_revoke = lambda token: self.turns.revoke(token, self._runner.revoke)
        self.handoff.slot_freed = self._slot_freed_everywhere
        self.claimer.outage = self.events.outage = self.endings.outage = Outage()
        self.executor = Executor(self.loader.resolve, self._runner,
                                 Quarantine(self.loader, listener_name(self.id)),
                                 RecurrenceHook(self.redis, self.keys, self._scripts), self.tracker,
                                 self._precise, self.flow,
                                 f"listener {self.id} (package {self.loader.package!r}, "
                                 f"groups {', '.join(self.groups)})",
                                 self.turns, Fence(self._held, self._scripts, self.lease),
                                 self.peers)

    @property
    def subscribed(self) -> asyncio.Event:
        """Set while the event subscription is up (or the listener goes without it)."""
        return self.events.subscribed

    @property
    def aborted(self) -> bool:
        return self._abort_event.is_set()

    # -- lifecycle --------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None, *, burst: bool = False) -> None:
        """Listen until ``stop`` is set (or, with ``burst``, until nothing is due); then
        stop claiming, give running tasks ``shutdown_timeout`` seconds, write endings."""
        self._burst = burst
        events = await preflight(self)
        if self.quarantine_ahead:  # started soon rather than at the first rerun, off the loop
            self._forkserver = asyncio.create_task(self._start_quarantine())
            self._forkserver.add_done_callback(_forkserver_started)
        with contextlib.suppress(*RETRYABLE):
            await self.peers.warn_other_packages()
        await self.recycler.wait_for_turn(self._stopping)  # a standby waits to take over
        log.info("listening: tasks package %r loaded, prefix %r%s, concurrency %d, lease %g s",
                 self.loader.package, self.prefix, shard_note(self._lanes), self.concurrency,
                 self.lease)
        watch = LoopWatch(asyncio.get_running_loop(), self._runner.on_loop.copy).start()
        watcher = asyncio.create_task(self._watch(stop)) if stop is not None else None
        try:
            ended = await asyncio.gather(*(lane._serve(events) for lane in self._lanes),
                                         return_exceptions=True)
        finally:
            self._stopping.set()
            if watcher is not None:
                watcher.cancel()
            watch.close()
            self.recycler.close(asyncio.get_running_loop())
            self._runner.shutdown()
            self._precise.close()
            if self._owns_client:
                await self.redis.aclose()
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _start_quarantine(self) -> None:
        """Start quarantine's process a few seconds into the listener's life: not while it
        starts up itself (a listener that only runs a burst never pays for it), and well
        before a rerun is likely (a listener died: its leases lapse after ``--lease``)."""
        await asyncio.sleep(min(QUARANTINE_AHEAD_DELAY, self.lease / 2))
        await asyncio.to_thread(prestart)

    async def _serve(self, events: bool) -> None:
        """One lane (the listener itself, with one shard): claim, run and finish its
        shard's timers until the listener stops (or, in a burst, nothing is due)."""
        keeper = LeaseKeeper(sync_twin(self.redis, min(15.0, max(1.0, self.lease))),
                             self.keys, self.lease, self._held).start()
        loops = [
            asyncio.create_task(self.events.run() if events else self.events.run_without(),
                                name="timers-events"),
            asyncio.create_task(self.endings.run(), name="timers-finish"),
            asyncio.create_task(self._heartbeat_loop(), name="timers-heartbeat"),
        ]
        for loop_task in loops:
            loop_task.add_done_callback(self._loop_ended)
        try:
            await self.claimer.run(self._burst)
        finally:
            self._lane_stopping.set()  # this lane's events, heartbeat and near keys
            if not self._burst or len(self._lanes) == 1:
                self._stopping.set()  # (a burst's lanes end each when its shard is done)
            await drain(self)
            self._closed.set()
            await asyncio.to_thread(keeper.close)
            await end_loops(self.endings, loops)
            await self.endings.flush_remaining(self.clock)
            with contextlib.suppress(*RETRYABLE):
                await self._heartbeat(alive=False)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A loop must only end on stop: if one dies of a bug, stop rather than limp on
        (``--processes`` restarts the listener; alone, it exits nonzero)."""
        if task.cancelled() or self._closed.is_set():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("%s loop died: %r; stopping the listener", task.get_name(), exc,
                         exc_info=exc)
            self._root.crashed = True
            self.abort()

    def stop(self) -> None:
        """Stop claiming, let running tasks finish, hand the rest back (sets flags only)."""
        self.recycler.hurry.set()
        self._stop_claiming()

    def _stop_claiming(self) -> None:
        self._stopping.set()
        for lane in self._lanes:
            lane._lane_stopping.set()
            lane.claimer.poke.set()
        self._slot_freed_everywhere()

    def _slot_freed_everywhere(self) -> None:
        """A run ended (or a handoff's reserved slots came back): every lane may claim."""
        for lane in self._lanes:
            lane.claimer.slot_freed.set()

    def abort(self) -> None:
        """Like :meth:`stop`, without waiting for running tasks: they are handed back."""
        self._abort_event.set()
        self.stop()

    def _give_up(self, exc: BaseException) -> None:
        """A permanent error (:func:`~timers.listener.permissions.is_permanent`): stop."""
        log.error("cannot claim timers: %s; stopping", explain(exc, self.keys))
        self._root.crashed = True
        self.stop()

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    # -- runs -------------------------------------------------------------------------

    def load(self) -> tuple[int, int]:
        """(runs under way, runs it could start now): for metrics."""
        return self._running_count(), self._free_slots()

    def _running_count(self) -> int:
        """Runs going (a run next in line takes its place when the one before it ends)."""
        return sum(len(lane._running) - lane.turns.waiting for lane in self._lanes)

    def _free_slots(self) -> int:
        """Of the concurrency, what no lane's run, stuck task or handoff holds."""
        if len(self._lanes) == 1:
            return (self.concurrency - len(self._running) + self.turns.waiting
                    - self._runner.stuck - self.handoff.reserved)
        return (self.concurrency - self._running_count() - self._runner.stuck
                - sum(lane.handoff.reserved for lane in self._lanes))

    def _hand_back_now(self, run: Run) -> None:
        self._held.hold(run.token, run.timer_id)
        self.endings.add(Ending.release(run.token))

    def _start(self, run: Run) -> None:
        if run.source == ClaimSource.RECOVERED.label:
            done = self.endings.unwritten_ending_of(run)
            if done is not None:
                # This listener ran the timer but could not write the ending before the
                # lease lapsed (Redis stalled): the run happened, so end the new claim the
                # same way instead of running the task twice.
                log.warning("timer %s: lease lapsed while its ending was on its way; "
                            "not running it again", run.timer_id)
                self._held.hold(run.token, run.timer_id)
                self.endings.add(done.for_run(run), self.endings.facts_of(done))
                return
        self._running[run.token] = run
        self._held.hold(run.token, run.timer_id)
        self.turns.start(run)
        task = asyncio.create_task(self._run_one(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _after_endings_written(self) -> None:
        if self._burst:
            self.claimer.poke.set()  # the sweep loop decides whether the burst is over

    def _busy(self) -> bool:
        """Runs going, events waiting, or endings not written yet (a retry due at once is
        due only once its ending is written: a burst is not over before then)."""
        return bool(self._running or self.events.pending or len(self.endings))

    async def _run_one(self, run: Run) -> None:
        try:
            done = await self.executor.execute(run)
        except asyncio.CancelledError:
            return  # shutting down: _drain hands this run back
        finally:
            self._running.pop(run.token, None)
            self.turns.end(run.token)
            self._slot_freed_everywhere()
            if self._burst:
                self.claimer.poke.set()  # the sweep loop decides whether the burst is over
        self.tally.ended(done)
        if done.ending is None:  # held back by a flow gate: the run is no longer ours
            self._held.release([run.token])
            return
        self.endings.add(done.ending, done.facts)
        if done.report is not None:
            self._root.ended_count += 1
            self._report(done)
            self.recycler.after_run(self._root.ended_count)

    def _report(self, done: Executed) -> None:
        if self.observer is None or done.report is None:
            return
        try:
            self.observer(done.report)
        except Exception:
            log.exception("observer failed")

    def _reject(self, event: Rejected) -> None:
        """Record an expired key that names no timer this listener can run; unless it
        names a well-formed timer that another live listener can run (it claims it)."""
        screened = (self.peers.screen(event.key, self.keys.timer_key_start.encode())
                    if event.escaped_id is not None else "reject")
        if screened == "reject":
            self._record_rejected(event)
        elif screened == "ask":  # the view in hand is old: read it again first
            task = asyncio.create_task(self._reject_unless_run_elsewhere(event))
            self._rejecting.add(task)
            task.add_done_callback(self._rejecting.discard)

    async def _reject_unless_run_elsewhere(self, event: Rejected) -> None:
        with contextlib.suppress(*RETRYABLE):
            await self.peers.view()
        if self.peers.run_elsewhere(event.key, self.keys.timer_key_start.encode()):
            log.debug("expired key %r: another live listener runs its task", event.key[:120])
            return
        self._record_rejected(event)

    def _record_rejected(self, event: Rejected) -> None:
        log.warning("rejected expired key %r: %s", event.key[:120], event.reason)
        failure_id, failure = rejected_entry(event.key, event.reason,
                                             self.tracker.redis_time_ms(), event.escaped_id)
        self.endings.add(Ending("", EndingKind.REJECT, failure_id=failure_id, failure=failure))
        self.tally.rejected()

    async def _heartbeat_loop(self) -> None:
        """The heartbeat, and the near keys alongside (a turn every few seconds each)."""
        await asyncio.gather(
            beat_until(self._lane_stopping, lambda: self._heartbeat(alive=True),
                       HEARTBEAT_INTERVAL),
            keep_near_keys(self._scripts, self._lane_stopping))

    async def _heartbeat(self, alive: bool) -> None:
        await heartbeat(self, alive)


def _forkserver_started(task: asyncio.Task[None]) -> None:
    """A quarantine process that could not be started ahead is started at the first rerun."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("quarantine process not started ahead: %s", task.exception())
