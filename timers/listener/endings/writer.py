"""The writer that records in Redis how runs ended.

The :class:`EndingWriter` writes the runs' endings (:mod:`timers.listener.endings.ending`)
in batches of one script call, keeps their leases until the reply is read
(:class:`HeldRuns`), and remembers the endings not written yet so that a run recovered
after its lease lapsed is ended the same way, not run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from timers.listener.endings.ending import Ending
from timers.listener.endings.history import ENDS, OFF, HistoryPolicy, history_text, series_of
from timers.listener.endings.journal import Journal
from timers.listener.eviction import report_late_finishes
from timers.listener.leases import HeldRuns, still_held
from timers.listener.retrying import RETRYABLE, Outage, Retry
from timers.model.clock import Clock, SystemClock
from timers.model.keys import Keyspace
from timers.model.runs import Run, RunFacts
from timers.model.wire import EndingKind
from timers.store.replicated import UnreplicatedReply
from timers.store.script_rows import Taker
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")

MAX_BATCH = 500
"""Endings written per script call (and timers taken per claim)."""

EXTRAS_EVERY = 1.0
"""Seconds between the finish calls that write the series and store the history's
retention: the calls between them write only the endings and their history records, and
the writer sums their runs' series meanwhile, so what each call costs once (the series
slots' read and merge, the retention GET) is paid about once a second, not once per
batch. The history is trimmed by :class:`timers.listener.endings.history.HistoryTrimmer`."""

GATHER = 0.004
"""Seconds at least between the starts of two batches :meth:`EndingWriter.run` writes: a
batch that comes sooner after the last waits out the rest, so in a burst each script call
carries more endings (a finish call has a fixed cost in Redis before its first ending,
and the listener a round trip). Not when GATHER_ENOUGH endings are queued, nor for an
ending that may free a flow slot (its key's or task's next run waits for it) or hands a
run back: those are written at once, as is a lone ending
(figures: bench/FINDINGS.md, "Fixed costs of claims and finish calls")."""
GATHER_ENOUGH = 64


_GATHERED = frozenset({EndingKind.OK, EndingKind.SKIP, EndingKind.FAIL, EndingKind.RETRY,
                       EndingKind.REJECT})
"""The endings that may wait for others (:data:`GATHER`): a hand-back is written at once."""


class EndingWriter:
    """Writes endings in batches; each is kept here until Redis has it.

    ``taker``: what the listener may be handed for a batch of endings of these run tokens
    (its free slots, reserved till the reply): timers a freed concurrency key slot lets go,
    as runs of its own; ``on_handed`` is called with the runs handed over and the slots
    reserved for them (:class:`~timers.listener.flow.handoff.Handoff`); ``on_written`` after
    each batch is written."""

    def __init__(self, scripts: Scripts, keys: Keyspace, failure_retention: float,
                 held: HeldRuns, closed: asyncio.Event, clock: Clock | None = None, *,
                 taker: Callable[[list[str]], Taker],
                 on_handed: Callable[[list[Run], int], None],
                 on_written: Callable[[], None], outage: Outage,
                 history: HistoryPolicy = OFF, listener_id: str = "",
                 task_retention: Callable[[], Mapping[str, tuple[int | None, int | None]]]
                 = dict) -> None:
        self.scripts, self.keys, self.held = scripts, keys, held
        self.history, self.listener_id = history, listener_id
        """What the endings keep of their runs, and the name their records give."""
        self.task_retention = task_retention
        """Task -> its own history age ms (None: the listener's) and count (None: the
        listener's only), of the tasks this listener runs: stored with its first finish
        call, for ``cancel.lua`` (``P|histtask``, ``P|histtaskn``)."""
        self._retention_stored = False
        """Whether a trim call stored the retention and the tasks' ages in this shard. The
        first is made at once, endings or not, so a cancel on a shard where nothing ended
        yet keeps to this listener's retention too."""
        self._facts: dict[str, RunFacts] = {}
        """Run token -> what the history and series keep of it, till its ending is written."""
        self._unsummed: list[RunFacts] = []
        """Runs whose endings are written but whose series are not yet (see EXTRAS_EVERY)."""
        self._extras_at = -math.inf
        """When (monotonic) the series and the retention were last written."""
        self.clock = clock or SystemClock()
        self.failure_retention = failure_retention
        self.closed = closed
        self.eviction_policy: str | None = None
        """Named when late finishes are reported (see :mod:`timers.listener.eviction`)."""
        self.taker, self.on_handed, self.on_written = taker, on_handed, on_written
        self.outage = outage
        self.ready = asyncio.Event()
        self._queue: list[Ending] = []
        self._sent_at = -math.inf
        """When (monotonic) :meth:`run` last sent a batch."""
        self._prompt = False
        """An ending queued is to be written without waiting for others."""
        self._hurry = asyncio.Event()
        """Set when such an ending is queued: it ends the wait for others."""
        self.journal: Journal | None = None
        """Where each ending is kept on disk till Redis has it (:mod:`timers.listener.
        journal`), as this lane's (``lane``)."""
        self.lane = 0

    def add(self, ending: Ending, facts: RunFacts | None = None, prompt: bool = False) -> None:
        """Queue an ending; ``facts``: what the history and the series keep of its run;
        ``prompt``: write it without waiting for others (see :data:`GATHER`)."""
        self._queue.append(ending)
        if self.journal is not None:
            self.journal.ending(self.lane, ending)
        if prompt or ending.kind not in _GATHERED:
            self._prompt = True
            self._hurry.set()
        if facts is not None:
            self._facts[ending.token] = facts
        self.ready.set()

    def facts_of(self, ending: Ending) -> RunFacts | None:
        """The facts queued with an ending not written yet."""
        return self._facts.get(ending.token)

    def __len__(self) -> int:
        return len(self._queue)

    def queued(self) -> list[Ending]:
        return list(self._queue)

    def unwritten_ending_of(self, run: Run) -> Ending | None:
        """The ending of an earlier run of the same timer that is not written yet."""
        for ending in self._queue:
            if ending.run_of == (run.escaped_id, run.due_ms):
                return ending
        return None

    def ended_before(self, run: Run) -> bool:
        """For a rerun: whether its cut run had ended, so the rerun ends the same way, its
        ending queued, instead of running the task twice. Either this listener ran it but
        could not write its ending before the lease lapsed (Redis stalled), or a listener
        of this host that went away before writing it had ended it: its journal says so (a
        run next in line taken back into its key's queue when the run before it was
        recovered, T5, says not which listener: any journal may)."""
        done = self.unwritten_ending_of(run)
        if done is not None:
            log.warning("timer %s: lease lapsed while its ending was on its way; "
                        "not running it again", run.timer_id)
            self.add(done.for_run(run), self.facts_of(done))
            return True
        if self.journal is not None and (
                done := self.journal.others.ending_of(run.died_on or None, self.lane, run)
        ) is not None:
            log.warning("timer %s: its run had ended in listener %s, which went away "
                        "before writing it; ended the same way, not run again",
                        run.timer_id, run.died_on or "of this host")
            self.add(done.for_run(run))
            return True
        return False

    async def run(self) -> None:
        """Write endings as they come until the listener closes."""
        retry = Retry(self.closed, "finishing runs", self.outage)
        while not self.closed.is_set():
            if not self._queue:
                self.ready.clear()
                if not self.extras_owed and self._retention_stored:
                    await self.ready.wait()
                    continue
                wait = self._extras_at + EXTRAS_EVERY - self.clock.monotonic()
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.ready.wait(), wait)
                    continue
            wait = self._sent_at + GATHER - self.clock.monotonic()
            if wait > 0 and not self._prompt and len(self._queue) < GATHER_ENOUGH:
                self._hurry.clear()  # in a burst: let the batch grow a little
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), wait)
            self._sent_at, self._prompt = self.clock.monotonic(), False
            try:
                await self.flush()
            except RETRYABLE as exc:
                await retry.failed(exc)
            else:
                retry.ok()

    @property
    def extras_owed(self) -> bool:
        """Whether runs' endings are written but not yet summed into the series (a call
        with no endings writes them, EXTRAS_EVERY at the latest)."""
        return bool(self._unsummed)

    async def flush(self, final: bool = False) -> None:
        """Write the first batch of endings in one script call (possibly none: then the
        series owed). It writes the series summed since the last such call and stores the
        retention when ``final`` or EXTRAS_EVERY has passed since then."""
        batch = self._queue[:MAX_BATCH]
        tokens = [ending.token for ending in batch]
        # Renewed until the reply is read (the loop may block before it is), and a renewal
        # that crosses the ending drops them quietly.
        self.held.ending(tokens)
        taker = self.taker(tokens)
        wires, ran = self._with_history(batch)
        sent = self.clock.monotonic()
        extras = final or sent - self._extras_at >= EXTRAS_EVERY
        series, retention = self._extras(ran) if extras else ([], [])
        try:
            reply = await self.scripts.finish(
                retention_ms=round(self.failure_retention * 1000), endings=wires,
                taker=taker, history=self.history.wire, series=series, store_retention=extras,
                task_retention=retention)
        except BaseException:
            self.held.ending(tokens, sent=False)
            self.on_handed([], taker.take)
            raise
        waited = self.clock.monotonic() - sent
        self._written(batch, tokens, ran, sent if extras else None)
        items = reply[1:]
        handed = [Run.parse(*items[i:i + 3]) for i in range(0, len(items), 3)]
        if handed and isinstance(reply, UnreplicatedReply):
            log.warning(reply.held_back(len(handed), "handed on by ended runs"))
            handed = []
        if handed and waited > taker.lease_ms / 2000:
            handed = await self._still_held(handed, taker.lease_ms, waited)
        self.on_handed(handed, taker.take)
        self.on_written()
        report_late_finishes(int(reply[0] or 0), self.eviction_policy)

    def _extras(self, ran: list[RunFacts]) -> tuple[list[tuple[str, str]],
                                                    list[tuple[str, str, str]]]:
        """What a flush that carries the extras writes besides the endings: the series
        summed since the last one (with ``ran``), and each task's retention unless stored."""
        series: list[tuple[str, str]] = []
        retention: list[tuple[str, str, str]] = []
        if self.history.series:
            series = series_of(self._unsummed, ran)
        if not self._retention_stored and self.history.keeps:
            retention = [(task, "" if age is None else str(age),
                          "" if count is None else str(count))
                         for task, (age, count) in sorted(self.task_retention().items())]
        return series, retention

    def _written(self, batch: list[Ending], tokens: list[str], ran: list[RunFacts],
                 extras_sent: float | None) -> None:
        """``batch`` is written (with the extras, sent at ``extras_sent``, unless None): its
        runs are released, its journal lines done, and it leaves the queue."""
        if extras_sent is not None:
            self._unsummed, self._extras_at = [], extras_sent
            self._retention_stored = True
        elif self.history.series:
            self._unsummed += ran
        self.held.release(tokens)
        if self.journal is not None:
            self.journal.written(tokens)
        del self._queue[: len(batch)]
        if self._facts:
            for ending in batch:
                self._facts.pop(ending.token, None)

    def _with_history(self, batch: list[Ending]) -> tuple[list[tuple[str, ...]],
                                                         list[RunFacts]]:
        """Each ending's ``finish.lua`` values, with its history record when it ends its
        timer (and its task keeps history); the facts of the batch's runs."""
        known = self._facts
        if not known:
            return [ending.wire() for ending in batch], []
        keeps, listener = self.history.keeps, self.listener_id
        wires: list[tuple[str, ...]] = []
        ran = []
        for ending in batch:
            facts = known.get(ending.token)
            if facts is None:
                wires.append(ending.wire())
                continue
            ran.append(facts)
            age, count = facts.history_ms, facts.history_count
            if keeps and facts.ends and age != 0 and count != 0 and ending.kind in ENDS:
                keep = "" if age is None else str(age)
                wires.append((*ending.wire(), facts.escaped_id,
                              history_text(facts, ending.kind, listener),
                              keep if count is None else f"{keep}|{count}"))
            else:
                wires.append(ending.wire())
        return wires, ran

    async def _still_held(self, runs: list[Run], lease_ms: int, waited: float) -> list[Run]:
        """Handed runs read late: only those still this listener's. A run next in line
        after one taken over is handed back (it would not hold the slot). The endings are
        written already, so nothing here may fail the batch: runs not known to be held
        are left to their leases, and run once, elsewhere or here."""
        try:
            kept = await still_held(self.scripts, lease_ms, runs, waited, "handoff")
        except Exception as exc:
            log.warning("could not renew %d handed run(s) read %.1f s late (%s): leaving them "
                        "to their leases", len(runs), waited, exc)
            return []
        taken = {run.token for run in runs} - {run.token for run in kept}
        for run in kept:
            if run.follows in taken:
                self.held.hold(run.token, run.timer_id)
                self.add(Ending.release(run.token))
        return [run for run in kept if run.follows not in taken]

    async def flush_remaining(self, clock: Clock, within: float = 5.0,
                              sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        """Write what is left, trying for ``within`` seconds if Redis is away (the
        retention, when nothing else is owed, is tried once)."""
        deadline = clock.monotonic() + within
        while (self._queue or self.extras_owed) and clock.monotonic() < deadline:
            try:
                await self.flush(final=True)
            except RETRYABLE:
                await sleep(0.2)
        if not self._retention_stored:
            with contextlib.suppress(*RETRYABLE):
                await self.flush(final=True)
        if self._queue:
            log.error("could not write %d run ending(s) before exit; their leases will lapse "
                      "and they will run again", len(self._queue))
