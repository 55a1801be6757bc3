"""What the lanes of one listener share (:class:`Shared`), and what spans them: the
listener's runner and free slots, a freed slot, stop and abort, the endings journals of
this host's dead listeners. The lanes (:mod:`timers.listener.lanes`) are made with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import redis.asyncio

from timers.listener.calling.loader import TaskLoader
from timers.listener.calling.runner import Runner
from timers.listener.endings.adoption import DeadJournal
from timers.listener.endings.history import HistoryPolicy
from timers.listener.endings.journal import Journal
from timers.listener.finding.claimer import Claimer, CpuGauge
from timers.listener.flow.handoff import Handoff
from timers.listener.flow.turns import Turns
from timers.listener.health import spans
from timers.listener.health.peers import Peers
from timers.listener.health.tally import RunTally
from timers.listener.retrying import RETRYABLE
from timers.listener.supervision.recycling import RecycleLimits, Recycler, report_fd
from timers.listener.tuning.precise import PreciseSleeper
from timers.model.clock import Clock
from timers.model.runs import Fired, Run
from timers.ops.replication import Replication
from timers.store.listener_client import ReservedConnection
from timers.store.lua_library import AsyncFunction
from timers.store.script_manifest import ScriptName
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")


class LaneView(Protocol):
    """What :class:`Shared` reads and tells of a lane (:class:`timers.listener.lanes.Lane`)."""

    running: dict[str, Run]
    turns: Turns
    handoff: Handoff
    claimer: Claimer
    stopping: asyncio.Event

    def use_journal(self, journal: Journal | None) -> None:
        ...

    async def replay(self, dead: DeadJournal) -> int:
        ...


L = TypeVar("L", bound=LaneView)


def _nothing() -> None:
    """:attr:`Shared.work_started` before the listener runs (nothing watches yet)."""


class Shared(Generic[L]):
    """What the lanes of one listener share, and what spans them: the listener's free
    slots, a freed slot, stop and abort. The listener makes it and its lanes."""

    def __init__(self, client: redis.asyncio.Redis, db: int, listener_id: str,
                 groups: Sequence[str], *, concurrency: int, lease: float,
                 shutdown_timeout: float, failure_retention: float, clock: Clock,
                 max_sleep: float, loader: TaskLoader, peers: Peers,
                 observer: Callable[[Fired], None] | None,
                 recycle: RecycleLimits | None, history: HistoryPolicy,
                 rate_start_window: float | None,
                 replication: Replication | None = None) -> None:
        self.redis, self.db, self.id, self.groups = client, db, listener_id, groups
        self.rate_start_window = rate_start_window
        """A rate's runs start within this of their gate call, or give their slot back
        (:data:`timers.listener.flow.gate.START_WINDOW_S`); None: however late."""
        self.reserved: list[ReservedConnection] = []
        self.replication = replication
        """Replicas a claim must reach before its runs start (:mod:`timers.store.replicated`)."""
        self.history = history
        """What the run history and the series keep (:mod:`timers.listener.endings.history`)."""
        self.concurrency, self.lease, self.shutdown_timeout = concurrency, lease, shutdown_timeout
        self.failure_retention, self.clock, self.max_sleep = failure_retention, clock, max_sleep
        self.loader, self.peers, self.observer = loader, peers, observer
        self.started_at, self.ended_count = time.time(), 0
        """Runs this listener ended, however they ended (Stats.fired counts the good)."""
        self.crashed = False
        """A loop died of a bug or a permanent error stopped it: exit nonzero."""
        self.burst = False
        """Until nothing is due (set by :meth:`Listener.run`)."""
        self.tally = RunTally(observers=spans.observers())
        """How runs ended, for the log (``tally.log_fires``: a line per fired timer)."""
        self.stopping = asyncio.Event()  # stop claiming
        self.aborting = asyncio.Event()
        self.lanes: list[L] = []
        """One per shard, in shard order (the list is the listener's: refilled in place
        once the layout is read)."""
        self.cpu = CpuGauge()
        """Whether the process's CPU bounds its runs (its claims and its threads' results
        are gathered in longer batches then)."""
        self.runner = Runner(concurrency, on_free=self.slot_freed, busy=self.cpu.busy)
        self.precise = PreciseSleeper()
        self.recycler = Recycler(recycle, self.stop_claiming, report_fd())
        self.work_started: Callable[[], None] = _nothing
        """Called as a run starts with none going in its lane (the loop watch's wake)."""
        self.journal: Journal | None = None
        """Where endings are kept on disk till Redis has them (:mod:`timers.listener.
        journal`)."""

    def use_journal(self, journal: Journal | None) -> None:
        """Keep every lane's endings in ``journal`` (once the lanes are made)."""
        self.journal = journal
        self.runner.use_journal(journal)
        for lane in self.lanes:
            lane.use_journal(journal)

    async def adopt_journals(self) -> None:
        """Until the listener stops, write the endings in the journals of this host's dead
        listeners of the prefix: at once, then every third of a lease (their leases
        lapse a lease after their last renewal, a third of a lease before their death)."""
        journal = self.journal
        if journal is None:
            return
        while not self.stopping.is_set():
            for dead in journal.others.dead():
                try:
                    replayed = [await lane.replay(dead) for lane in self.lanes]
                except RETRYABLE as exc:
                    log.debug("journal %s not adopted yet: %s", dead.path, exc)
                    dead.release()
                    continue
                except BaseException:
                    dead.release()
                    raise
                unknown = set(dead.contents.endings) - set(range(len(self.lanes)))
                if unknown:
                    log.warning("journal %s has endings of shard(s) %s, which this listener "
                                "does not serve: left to their leases", dead.path,
                                sorted(unknown))
                dead.adopted()
                log.info("adopted the journal of listener %s, which died: %d ending(s) of "
                         "runs it still held written", dead.contents.owner, sum(replayed))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.lease / 3)

    def reported(self, report: Fired) -> None:
        """A run ended with a report (:class:`~timers.model.runs.Fired`): count it, hand it
        to the observer, and let the recycler see the count."""
        self.ended_count += 1
        if self.observer is not None:
            _tell(self.observer, report)
        self.recycler.after_run(self.ended_count)

    def reserve(self, scripts: Scripts, *names: ScriptName) -> None:
        """Each script of ``names`` sent on a connection of its own
        (:class:`~timers.store.listener_client.ReservedConnection`): a lane's claims and its
        batches of endings, each sent one at a time. Only on a client the listener made
        for a plain URL; :meth:`close_reserved` closes them. With :attr:`replication`, each
        is sent with ``WAIT`` behind it instead, through the client's pool."""
        if self.replication is not None:
            scripts.replicated(self.replication.replicas, self.replication.timeout_ms, *names)
            return
        for name in names:
            function = scripts.script(name)
            if not isinstance(function, AsyncFunction):
                continue
            reserved = ReservedConnection.of(self.redis)
            if reserved is None:
                return
            function.send_by(reserved.execute_command)
            self.reserved.append(reserved)

    async def close_reserved(self) -> None:
        """Close the connections :meth:`reserve` kept aside."""
        for reserved in self.reserved:
            await reserved.aclose()

    def running_count(self) -> int:
        """Runs going (a run next in line takes its place when the one before it ends)."""
        return sum(len(lane.running) - lane.turns.waiting for lane in self.lanes)

    def free_slots(self) -> int:
        """Of the concurrency, what no lane's run, stuck task or handoff holds."""
        return (self.concurrency - self.running_count() - self.runner.stuck
                - sum(lane.handoff.reserved for lane in self.lanes))

    def slot_freed(self) -> None:
        """A run ended (or a handoff's reserved slots came back): every lane may claim."""
        for lane in self.lanes:
            lane.claimer.slot_freed.set()

    def stop(self) -> None:
        """Stop claiming, let running tasks finish, hand the rest back (sets flags only)."""
        self.recycler.hurry.set()
        self.stop_claiming()

    def stop_claiming(self) -> None:
        self.stopping.set()
        for lane in self.lanes:
            lane.stopping.set()
            lane.claimer.poke.set()
        self.slot_freed()

    def abort(self) -> None:
        """Like :meth:`stop`, without waiting for running tasks: they are handed back."""
        self.aborting.set()
        self.stop()

    def describe(self) -> dict[str, Any]:
        """The listener as ``timers listeners`` shows it (every lane heartbeats the same,
        in its own shard)."""
        return {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(),
                "started": round(self.started_at), "running": self.running_count(),
                "fired": self.ended_count, "concurrency": self.concurrency,
                "tasks": self.loader.package, "stuck": self.runner.stuck,
                "groups": self.groups, "task_set": self.peers.digest,
                **self.tally.recent.summary(),
                **self.recycler.heartbeat_info(self.stopping.is_set())}


def _tell(observer: Callable[[Fired], None], report: Fired) -> None:
    """Hand a run's report to the listener's observer; its failure is logged, not raised."""
    try:
        observer(report)
    except Exception:
        log.exception("observer failed")
