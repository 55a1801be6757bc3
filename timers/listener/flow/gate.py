"""The flow gate: whether a claimed run may start now, asked of Redis in one script call.

A run is gated when its timer names a concurrency key (``schedule(key=...)``) or its task
declares ``concurrency``, ``key`` or ``rate`` (see :mod:`timers.model.policy`). The decision is
atomic in ``gate.lua`` (fleet-wide, no leader): the run goes, holding a slot until it ends,
or its timer waits in the key's or the rate limit's queue and the run ends here without an
attempt counted. Runs with no limits never call Redis here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from timers.exceptions import FlowKeyError
from timers.listener.flow.plan import plan_ahead, plan_of_run
from timers.listener.leases import HeldRuns
from timers.listener.retrying import RETRYABLE
from timers.model.encoding import Record, as_text
from timers.model.flow.names import unescape_key
from timers.model.policy import TaskPolicy
from timers.model.runs import Outcome, Run
from timers.model.wire import ClaimSource, Option
from timers.ops.shards import shard_of_key
from timers.store.script_rows import GateRun
from timers.store.scripts import Scripts

GO = "go"
HANDED = frozenset({ClaimSource.HANDOFF.label, ClaimSource.NEXT.label})
"""Runs ``finish.lua`` handed over holding their key's slot, or to take it over from the
run before them (:mod:`timers.listener.flow.turns`)."""
START_WINDOW_S = 0.010
"""How long after its gate call was sent a run a rate let go (with no concurrency key, or
one whose limit is 1) may still call its function (the default of
``Listener(rate_start_window=)``).
The gate lets a rate's runs go an interval apart (less 5 ms) on the Redis clock; a run
that reached its call later than this asks its gate once more (T29: while no start of its
rate was let go since and it is late by less than an interval, the rate's slots move on by
its lateness), then is handed back unstarted (T17) rather than start closer than that to
the next one, whose listener may be quicker: so two calls of a rate's task are never closer
than the interval less 15 ms (and the instant from the check to the task's first line),
whatever the listeners' load (docs/state-machine.md, invariant 3)."""


class Admission(NamedTuple):
    """The flow gate's word on a run."""

    held: Outcome | None
    """None: start the run; else why it is not this listener's to run any more."""
    start_by: float | None = None
    """Monotonic: for a run a rate let go, the latest it may call its function."""


FREE = Admission(None)
"""Start the run, whenever it gets to it."""


class FlowGate:
    """Asks ``gate.lua`` about the runs that have limits.

    The runs of one claim start together, so their questions are gathered for one turn
    of the event loop and sent in one script call. ``on_held`` is told how many claimed
    runs :meth:`screen` held back (they never start); ``shards``: the prefix's, where a
    limit is counted in each (see :func:`_per_shard`); ``shard``: its lane's.
    """

    def __init__(self, scripts: Scripts, lease: float, *, on_held: Callable[[int], None],
                 shards: int, shard: int, window: float | None = START_WINDOW_S,
                 held: HeldRuns | None = None) -> None:
        self.scripts, self.lease, self.window = scripts, lease, window
        self.on_held, self.shards, self.shard = on_held, shards, shard
        """``shard``: the one this gate's lane serves."""
        self.leases = held
        """The lane's held runs: a gate call may take a run it holds back out of the
        running set, so its runs are marked as ending while the call is out (a renewal
        that finds one gone then drops it without warning of a loss)."""
        self._asked: list[tuple[GateRun, asyncio.Future[tuple[str, float]]]] = []
        self.holding: set[str] = set()
        """Tokens of runs that went holding a concurrency key slot (until they end)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.held = 0
        """Runs the gate held back so far (the parker weighs whether parking pays)."""

    async def screen(self, runs: list[Run], resolve: Callable[[str], Callable[..., Any]]
                     ) -> list[Run]:
        """The claimed runs to start: those whose one limit is a concurrency key are asked
        about in one gate call first, and those held back are dropped here, before each
        becomes a task that would only learn it is held. A failed call decides nothing:
        each run asks at its start, as before. A run's plan, worked out here, is kept on it
        for its gate (:func:`~timers.listener.flow.plan.plan_of_run`). Under a burst of
        1,000 commands for 50 devices, 950 are held back: made into tasks, they kept the
        CPU busy while the 50 that could run waited
        (figures: bench/FINDINGS.md, "Runs held back before they start")."""
        asked = [(run, plan.gate_run(run.token)) for run in runs if not run.reruns
                 and (plan := plan_ahead(run.record_text, resolve, run)) is not None
                 and plan.key_only]
        if not asked:
            return runs
        try:
            reply = await self.scripts.gate(round(self.lease * 1000), [g for _, g in asked])
        except RETRYABLE:
            return runs
        statuses = {run.token: as_text(status)
                    for (run, _), status in zip(asked, reply, strict=True)}
        held = [run for run in runs if statuses.get(run.token, GO) != GO]
        # those let go hold their slot from now: at their start, admit asks no more
        self.holding.update(token for token, status in statuses.items() if status == GO)
        waited = sum(1 for run in held if statuses[run.token] == "wait")
        self.held += waited
        if held:
            self.on_held(len(held))
        return [run for run in runs if statuses.get(run.token, GO) == GO]

    async def admit(self, run: Run, record: Record, policy: TaskPolicy) -> Admission:
        """Whether to start the run (``held`` None), and by when if a rate let it go
        (:data:`START_WINDOW_S`). Else the run is not this listener's to run any more: its
        timer waits for its key or rate limit (or its lease was lost, or its id was
        scheduled again). A run holding its key's slot is asked no more, unless it has a
        rate: a rerun whose quarantine child found its lease stale, admitted again for a
        new child, takes a new slot of its rate (the one it took went unused)."""
        if self.shards > 1 and not self._exact(run, record, policy):
            _per_shard(record.task, self.shards)
        try:
            plan = plan_of_run(run, record, policy)  # once per run: its screen may have
        except FlowKeyError as exc:
            return Admission(Outcome("error", "FlowKeyError", str(exc)))
        if plan is None:
            return FREE
        if run.token in self.holding and not plan.rate:
            return FREE  # screened at its claim: its key and slot are settled
        spec = plan.gate_run(run.token)
        if run.source in HANDED and spec.key and not spec.rate:
            self.holding.add(run.token)  # finish.lua handed it over holding its key's slot
            return FREE
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[str, float]] = loop.create_future()
        if not self._asked:
            loop.call_soon(self._start_asking)
        self._asked.append((spec, answer))
        status, sent = await answer
        if status == "wait":
            self.held += 1
        if status == GO:
            if spec.key:
                self.holding.add(run.token)
            # the gate decided after `sent`: by this, the run starts within the window of it
            # (not a run holding one of several slots of its key: a later run of its key may
            # take another slot meanwhile, and would start first if this one were handed back)
            window = self.window
            return Admission(None, sent + window) \
                if spec.rate and window is not None and (not spec.key or spec.limit == 1) \
                else FREE
        return Admission(Outcome("held", status, _HELD_MESSAGES.get(status, status)))

    def _exact(self, run: Run, record: Record, policy: TaskPolicy) -> bool:
        """Whether the run's limit is one limit fleet-wide on a sharded prefix: its timer
        lives in the shard of its limit (:mod:`timers.ops.shards`): a concurrency key given
        at schedule time, with no rate, in its key's shard; else a limit the task declares,
        in the shard of its rate, else of its key (placed there at its first claim:
        :mod:`timers.listener.flow.placer`). Not: a recurrence's occurrence, whose shard is its
        recurrence's, or a keyed timer scheduled by an older producer."""
        escaped = record.options.get(Option.KEY)
        if escaped:
            return policy.rate is None and shard_of_key(
                unescape_key(escaped), self.shards) == self.shard
        try:
            plan = plan_of_run(run, record, policy)
        except FlowKeyError:
            return True  # the gate reports it
        return plan is None or shard_of_key(plan.home, self.shards) == self.shard

    def _start_asking(self) -> None:
        task = asyncio.get_running_loop().create_task(self._ask())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask(self) -> None:
        asked, self._asked = self._asked, []
        tokens = [spec.token for spec, _ in asked]
        leases = self.leases
        if leases is not None:
            leases.ending(tokens)
        sent = time.monotonic()
        try:
            reply = await self.scripts.gate(round(self.lease * 1000), [s for s, _ in asked])
        except Exception as exc:  # each run decides (a lost connection hands it back)
            if leases is not None:
                leases.ending(tokens, sent=False)
            for _, answer in asked:
                if not answer.done():
                    answer.set_exception(exc)
            return
        statuses = [as_text(status) for status in reply]
        if leases is not None:  # (those held back are released by their lane)
            leases.ending([t for t, s in zip(tokens, statuses, strict=True) if s == GO],
                          sent=False)
        for (_, answer), status in zip(asked, statuses, strict=True):
            if not answer.done():
                answer.set_result((status, sent))


_HELD_MESSAGES = {
    "wait": "held back by its concurrency key or rate limit: waits in its queue",
    "lost": "its lease was lost before it could start",
    "replaced": "a timer with its id was scheduled again meanwhile",
}


log = logging.getLogger("timers.listener")
_WARNED: set[str] = set()


def _per_shard(task: str, shards: int) -> None:
    """Say once per task that its limits hold per shard on a sharded prefix: a timer that
    is not in its limit's shard (see :mod:`timers.ops.shards`)."""
    if task in _WARNED:
        return
    _WARNED.add(task)
    log.warning("task %s has a timer outside the shard of its limit (a recurrence's occurrence, "
                "a timer with both key= and a rate, or one scheduled by an older producer), and "
                "the prefix is split into %d shards: its limit is counted in each shard, so up "
                "to %d times it can run at once fleet-wide. For an exact limit, schedule such "
                "timers without key= (the task's limit then places them) or give them a prefix "
                "of one shard (TIMERS_PREFIX=... TIMERS_SHARDS=1)", task, shards, shards)
