"""The listener: finds due timers, claims them, runs them, records how they ended.

It is made of parts with one job each, sharing one asyncio event loop, and each gets its
collaborators when it is made:

- **lanes** (:mod:`timers.listener.lanes`): a :class:`~timers.listener.lanes.Lane` per
  shard holds the parts below for its shard and runs what it claims; the lanes share a
  :class:`~timers.listener.shared.Shared` (the runner, the tasks, the flags, the tally).
- **events** (:mod:`timers.listener.finding.events`): the ``expired`` events and wake messages;
  each names a timer for the next claim, moves the next due time, or is rejected.
- **claimer** (:mod:`timers.listener.finding.claimer`): the due-driven sweep loop and the claim.
- **executor** (:mod:`timers.listener.executor`): runs one claimed timer, returns its
  :class:`Ending`.
- **endings** (:mod:`timers.listener.endings.writer`): writes endings in batches.
- **leases** (a thread: :mod:`timers.listener.leases`, so a blocked loop cannot starve
  it): keeps a live listener's timers; a dead one's run again once their lease lapses.

This module keeps the lifecycle: the checks at start (:mod:`timers.listener.health.preflight`),
one lane per shard, and stop: running tasks get ``shutdown_timeout`` seconds, the
unfinished runs go back to the due index so another listener runs them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio

from timers.listener.calling.loader import TaskLoader, configured_package
from timers.listener.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_FAILURE_RETENTION,
    DEFAULT_LEASE,
    TASKS_ENV,
)
from timers.listener.endings.history import HistoryPolicy
from timers.listener.endings.journal import Journal, server_identity
from timers.listener.finding.events import EventHub
from timers.listener.flow.gate import START_WINDOW_S
from timers.listener.health.loop_watch import LoopWatch
from timers.listener.health.peers import Peers
from timers.listener.health.preflight import (
    check_format,
    eviction_policy,
    read_layout,
    warn_if_events_off,
)
from timers.listener.health.tally import RunTally
from timers.listener.lanes import Lane, lanes_for, shard_note
from timers.listener.quarantine.parent import prestart
from timers.listener.retrying import RETRYABLE, ReconnectDelays, Retry
from timers.listener.shared import Shared
from timers.listener.supervision.recycling import RecycleLimits, Recycler
from timers.model.clock import Clock, SystemClock
from timers.model.flow.names import served_groups
from timers.model.keys import configured_prefix
from timers.model.runs import Fired
from timers.ops.replication import for_listener as replication_for
from timers.ops.shards import configured_shards
from timers.store.cluster import database_of, is_cluster, keyspace_for
from timers.store.listener_client import check_limits, client_of
from timers.store.permissions import SWEEP_ONLY_MAX_SLEEP, check_at_start

log = logging.getLogger("timers.listener")
QUARANTINE_AHEAD_DELAY = 3.0
"""Seconds after start-up that ``timers listen`` starts quarantine's process (at most half
a lease)."""



class Listener:
    """Runs timers as they come due. Start it with ``await listener.run()``.

    ``redis_`` is a URL or a ``redis.asyncio.Redis`` that returns bytes (the listener reads
    key names that may not be UTF-8). ``tasks`` is the package whose functions may run
    (default ``$TIMERS_TASKS`` or ``tasks``, found on ``PYTHONPATH`` first, then in
    ``search_path``, by default the working directory); ``registry`` adds callables by
    explicit name. ``shards``: as for [`timers.Timers`][timers.producer.client.Timers] (it serves
    every shard). ``quarantine_ahead``: start the process quarantine children fork from at start-up
    (``timers listen`` does), not at the first rerun after a listener died. ``history``:
    how long ended timers' records are kept and whether per-task series are written
    (default: 7 days, 100,000 records per shard, series on). ``rate_start_window``: how
    long after its gate call a run a rate let go may still start, in seconds (a run later
    than that gives its slot back and asks again, so the rate holds between the calls
    themselves); None: it starts however late ([`TimersTest`][timers.testing.TimersTest],
    whose in-memory server answers slower than that). ``replicas``: a run starts only once
    its claim is on that many replicas, waited for up to ``replicas_timeout`` seconds
    (default 1), so a failover never runs it again uncounted (`timers.store.replicated`;
    one primary with its replicas: a plain URL or Sentinel).
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
        rate_start_window: float | None = START_WINDOW_S,
        replicas: int | None = None,
        replicas_timeout: float | None = None,
    ) -> None:
        check_limits(concurrency, lease)
        self.shards, self.groups = configured_shards(shards), served_groups(groups)
        self.redis, self._owns_client = client_of(redis_)
        self.prefix = configured_prefix(prefix)
        self.keys, self.db = keyspace_for(self.redis, prefix), database_of(self.redis)
        replication = replication_for(self.redis, replicas, replicas_timeout)
        self.loader, self._tasks_optional = _task_loader(tasks, registry, search_path)
        self.allow_eviction = allow_eviction
        self.quarantine_ahead = quarantine_ahead
        self._forkserver: asyncio.Task[None] | None = None
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.peers = Peers.over(self.redis, self.keys, self.id, self.loader.package,
                                self.loader.task_names)
        """The other live listeners of the prefix and what they run (`timers.ops.fleet`)."""
        self.shared: Shared[Lane] = Shared(
            self.redis, self.db, self.id, self.groups, concurrency=concurrency, lease=lease,
            shutdown_timeout=shutdown_timeout, failure_retention=failure_retention,
            clock=clock or SystemClock(), max_sleep=max_sleep, loader=self.loader,
            peers=self.peers, observer=observer, recycle=recycle,
            history=HistoryPolicy() if history is None else history,
            rate_start_window=rate_start_window,
            replication=replication)
        self._subscribed = asyncio.Event()
        self.lanes.append(Lane(self.shared, self.keys, 0, announces=True, hub=EventHub(),
                               subscribed=self._subscribed))

    @property
    def concurrency(self) -> int:
        """How many of its runs go at once, at most."""
        return self.shared.concurrency

    @property
    def lease(self) -> float:
        """Seconds a run's lease lasts unless renewed (a dead listener's runs wait that long)."""
        return self.shared.lease

    @property
    def tally(self) -> RunTally:
        """How runs ended, for the log (``tally.log_fires``: a line per fired timer)."""
        return self.shared.tally

    @property
    def recycler(self) -> Recycler:
        """This listener's part in recycling (replaced at its limits: ``RecycleLimits``)."""
        return self.shared.recycler

    @property
    def lanes(self) -> list[Lane]:
        """One per shard of the prefix (one until [`run`][timers.listener.Listener.run] reads the
        layout)."""
        return self.shared.lanes

    @property
    def subscribed(self) -> asyncio.Event:
        """Set while the event subscription is up (or the listener goes without it)."""
        return self._subscribed

    @property
    def aborted(self) -> bool:
        return self.shared.aborting.is_set()

    @property
    def crashed(self) -> bool:
        """A loop died of a bug or a permanent error stopped it: exit nonzero."""
        return self.shared.crashed

    @property
    def ended_count(self) -> int:
        """Runs this listener ended, however they ended (Stats.fired counts the good)."""
        return self.shared.ended_count

    # -- lifecycle --------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None, *, burst: bool = False) -> None:
        """Listen until ``stop`` is set (or, with ``burst``, until nothing is due); then
        stop claiming, give running tasks ``shutdown_timeout`` seconds, write endings."""
        shared = self.shared
        shared.burst = burst
        events = await self._preflight()
        if self.quarantine_ahead:  # started soon rather than at the first rerun, off the loop
            self._forkserver = asyncio.create_task(self._start_quarantine())
            self._forkserver.add_done_callback(_forkserver_started)
        with contextlib.suppress(*RETRYABLE):
            await self.peers.warn_other_packages()
        await self.recycler.wait_for_turn(shared.stopping)  # a standby waits to take over
        log.info("listening: tasks package %r loaded, prefix %r%s, concurrency %d, lease %g s",
                 self.loader.package, self.prefix, shard_note(self.lanes), self.concurrency,
                 self.lease)
        watch = LoopWatch(asyncio.get_running_loop(), shared.runner.async_tasks,
                          busy=lambda: any(lane.running for lane in self.lanes)).start()
        shared.work_started = watch.work_started
        watcher = asyncio.create_task(self._watch(stop)) if stop is not None else None
        identity = await self._journal_identity()
        shared.use_journal(None if identity is None
                           else Journal.for_listener(identity, self.id, self.lease))
        adopting = asyncio.create_task(shared.adopt_journals(), name="timers-adopt")
        adopting.add_done_callback(_adopting_ended)
        try:
            ended = await asyncio.gather(*(lane.serve(events) for lane in self.lanes),
                                         return_exceptions=True)
            if burst:
                await self._say_what_waits()
        finally:
            shared.stopping.set()
            adopting.cancel()
            if watcher is not None:
                watcher.cancel()
            watch.close()
            self.recycler.close(asyncio.get_running_loop())
            shared.runner.shutdown()
            shared.precise.close()
            await shared.close_reserved()
            if shared.journal is not None:
                shared.journal.close()
            if self._owns_client:
                await self.redis.aclose()
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _say_what_waits(self) -> None:
        """At a burst's end: the timers a concurrency key or a rate limit still holds back.
        They came due, but their key or rate lets them start later: they stay pending, for a
        listener running then (a burst ends once nothing is due now)."""
        with contextlib.suppress(*RETRYABLE):
            held = sum([await self.redis.hlen(lane.keys.parked) for lane in self.lanes])
            if held:
                log.info("burst over with %d timer%s held back by a concurrency key or a rate "
                         "limit: pending, for a listener running when their slots free", held,
                         "" if held == 1 else "s")

    async def _journal_identity(self) -> str | None:
        """The prefix's id on its server (:func:`journal.server_identity`), asked until
        Redis answers (the lanes wait for their server too); None once the listener is
        stopping (a stop while Redis is out of reach ends it, as at any other time)."""
        retry = Retry(self.shared.stopping, told="cannot read the prefix's id for the endings "
                      "journal (%s); retrying", delays=ReconnectDelays(1.0, 1.0))
        return await retry.answer(
            lambda: server_identity(self.redis, self.keys.instance, self.prefix))

    async def _preflight(self) -> bool:
        """Load the tasks, check the prefix's data format and the server, and read the shard
        layout before any claim; False: no events (the Redis user may not subscribe, the
        sweeper works alone)."""
        try:
            # the whole tasks package, off the loop
            await asyncio.to_thread(self.loader.load_at_start, self._tasks_optional)
            await check_format(self.redis, self.keys, self.shared.stopping)
            await warn_if_events_off(self.redis)
            policy = await eviction_policy(self.redis, self.allow_eviction)
            missing = await check_at_start(self.redis, self.keys, self.db)
            layout = await read_layout(self.lanes[0].scripts, self.keys, self.prefix,
                                       self.shards, is_cluster(self.redis),
                                       self.shared.stopping)
            if layout is not None and layout.count > 1:
                self.lanes[:] = lanes_for(self.shared, layout, self._subscribed)
            self.recycler.start(asyncio.get_running_loop())  # the tasks are loaded: RSS
        except Exception:
            if self._owns_client:
                await self.redis.aclose()
            raise
        for lane in self.lanes:
            lane.endings.eviction_policy = policy
            if missing:
                lane.tracker.max_sleep = min(lane.tracker.max_sleep, SWEEP_ONLY_MAX_SLEEP)
        return "events" not in missing

    async def _start_quarantine(self) -> None:
        """Start quarantine's process a few seconds into the listener's life: not while it
        starts up itself (a listener that only runs a burst never pays for it), and well
        before a rerun is likely (a listener died: its leases lapse after ``--lease``)."""
        await asyncio.sleep(min(QUARANTINE_AHEAD_DELAY, self.lease / 2))
        await asyncio.to_thread(prestart, self.loader)

    def stop(self) -> None:
        """Stop claiming, let running tasks finish, hand the rest back (sets flags only)."""
        self.shared.stop()

    def abort(self) -> None:
        """Like [`stop`][timers.listener.Listener.stop], without waiting for running tasks: they are
        handed back."""
        self.shared.abort()

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    def load(self) -> tuple[int, int]:
        """(runs under way, runs it could start now): for metrics."""
        return self.shared.running_count(), self.shared.free_slots()


def _task_loader(tasks: str | None, registry: Mapping[str, Callable[..., Any]] | None,
                 search_path: str | None) -> tuple[TaskLoader, bool]:
    """The loader of the code a listener may run, and whether the listener may start
    without its tasks package (callables given by name, and no package named)."""
    optional = bool(registry) and tasks is None and not os.environ.get(TASKS_ENV)
    return (TaskLoader(configured_package(tasks), registry,
                       os.getcwd() if search_path is None else search_path), optional)


def _adopting_ended(task: asyncio.Task[None]) -> None:
    """Adopting dead listeners' journals is a help, never a reason to stop: logged."""
    if not task.cancelled() and task.exception() is not None:
        log.error("adopting the journals of dead listeners stopped: %r", task.exception(),
                  exc_info=task.exception())


def _forkserver_started(task: asyncio.Task[None]) -> None:
    """A quarantine process that could not be started ahead is started at the first rerun."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("quarantine process not started ahead: %s", task.exception())
