"""Suspect runs run in quarantine: in a child process, so a poison kills only itself.

A run with ``reruns >= 1`` was held by a listener whose lease lapsed: it died, or stalled
past its lease. The task may be the poison that killed it, or an innocent that was
running alongside the poison. Run in the listener again, the poison would kill it once
more, with every innocent it holds.

So a suspect run goes to a child process (``forkserver``: no fork of a threaded process),
forked with the tasks package imported (:mod:`timers.listener.quarantine.fork_server`). The child
(:mod:`timers.listener.quarantine.child`) loads the tasks package as the listener does,
runs the task and sends its :class:`Outcome` back over a pipe. Here a death
is seen, not inferred: a child that exits without an outcome is one crash of this timer
(a lapse is not: the listener that held it may have lived). It runs again in a new child
until those deaths reach the task's ``max_crashes``, and then ends dead
(:mod:`timers.listener.quarantine.crashes`).

The listener holds the lease throughout and shares how long it holds with the child
(:meth:`HeldRuns.share`): the child checks it right before the task's code, as a thread
does in the listener, and its ``timers.current().still_held()`` reads it too. A child
whose lease was not known to hold at the start runs nothing and says so (``stale``): the
listener revalidates the run, as for a stale start in a thread. The task's timeout kills
the child. Non-suspect runs never come here: they keep the in-process path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import pickle
import signal
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from timers.listener.calling import context as timer_context
from timers.listener.calling.loader import TaskLoader
from timers.listener.flow.gate import FREE, Admission
from timers.listener.leases import HeldRuns, SharedUntil
from timers.listener.quarantine import fork_server
from timers.listener.quarantine.child import (
    GO,
    LOADED_WORD,
    PARENT_GONE,
    STARTED_WORD,
    ChildLogs,
    child_main,
    portable,
)
from timers.listener.quarantine.crashes import died_outcome
from timers.model.encoding import Args
from timers.model.policy import TaskPolicy
from timers.model.runs import Outcome

log = logging.getLogger("timers.listener")

EXIT_GRACE = 2.0
"""Seconds a child that sent its outcome gets to exit before it is killed."""

STARTED = Outcome("ok", "", "started")
"""The child's message that the task is loaded and starts now."""

LOADED = Outcome("ok", "", "loaded")
"""A gated child's first message: the task is loaded, and the child waits for the word
(:data:`GO` with its start window, or anything else: leave it) before it starts it."""

LOADING_AT_ONCE = 1
"""Quarantine children of one listener process that load at once (from their fork until
they say they start the task, or :data:`LOADING_TURN` seconds). A listener killed holding
32 runs leaves 32 suspects to a peer: loading them all at once (an interpreter's share of
imports each) took both cores of a 2-core machine for 1 to 2 s, and every other timer ran
late meanwhile. One at a time, loading takes one core and the listener keeps the other;
tasks that started run side by side as before."""

LOADING_TURN = 5.0
"""Seconds a loading child holds its turn at most: a tasks package whose import hangs
delays other suspects by this much, not for ever."""

_context: Any = None
_turns: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _loading_turns() -> asyncio.Semaphore:
    """The turns to load of this event loop's quarantine children (one loop per listener
    process; a test may run several loops one after another)."""
    loop = asyncio.get_running_loop()
    turns = _turns.get(loop)
    if turns is None:
        for old in [other for other in _turns if other.is_closed()]:
            del _turns[old]
        turns = _turns[loop] = asyncio.Semaphore(LOADING_AT_ONCE)
    return turns


def _mp_context() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([fork_server.PRELOAD])
    return _context


def prestart(loader: TaskLoader) -> None:
    """Start the process quarantine children fork from, with timers and ``loader``'s tasks
    package imported in it (blocking: call it off the event loop;
    :mod:`timers.listener.quarantine.fork_server`). A listener's first rerun otherwise starts a
    Python interpreter and imports timers while its other timers come due, and each
    child imported the tasks package: on a 2-core machine every timer ran late for a
    while after a listener was killed
    (figures: bench/FINDINGS.md, "Quarantine children and the tasks package")."""
    _mp_context()
    fork_server.ensure_running(loader.package, loader.search_path, ChildLogs.here())


def is_suspect(reruns: int) -> bool:
    """A run whose listener's lease lapsed while it held it (the listener died, or stalled):
    run it in quarantine, where a death is seen."""
    return reruns >= 1


def how_it_died(exitcode: int | None) -> str:
    """``killed by SIGSEGV`` or ``exit code 1``."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class Quarantine:
    """Runs suspect runs in child processes; ``where`` names the listener (``host:pid``);
    ``held``: the runs whose leases this listener keeps (each shared with its child, which
    starts the task only while it holds)."""

    def __init__(self, loader: TaskLoader, where: str, held: HeldRuns) -> None:
        self.loader = loader
        self.where = where
        self.held = held

    async def run(self, timer_id: str, token: str, task: str, fn: Callable[..., Any],
                  args: Args, policy: TaskPolicy, reruns: int,
                  admit: Callable[[], Awaitable[Admission]] | None = None,
                  aside: tuple[str, bytes] | None = None) -> Outcome:
        """Run ``task`` (run ``token``) in a child until it ends with an outcome or the
        children that died here reach ``policy.max_crashes``, each counted as what it was
        (a start that died, or a child that died before it started the task). ``reruns``
        (lapsed leases before) is told in a dead timer's record, never counted as a crash.
        A child that found the lease not known to hold starts nothing: ``stale``.
        ``admit``: the run's flow gate, asked once a child has loaded the task and waits
        for the word to start it (held: that ends the run unstarted; a start window goes
        with the word, and a child past it starts nothing: ``late``). ``aside``: the file
        and line a child whose task returned writes before it says so
        (:func:`~timers.listener.endings.journal.note_aside`)."""
        died = before_start = 0
        target = self._target(task, fn)
        admitted = False

        async def admit_once() -> Admission:
            # the gate is asked once: a child started again after a death starts on the
            # slot the first took (held back there, the run would lose its deaths so far)
            nonlocal admitted
            if admitted or admit is None:
                return FREE
            admission = await admit()
            admitted = admission.held is None
            return admission

        cell: SharedUntil = _mp_context().RawValue("d", 0.0)
        self.held.share(token, cell)
        try:
            while True:
                outcome, exitcode, started = await self._once(
                    target, args, policy.timeout, cell, admit_once if admit else None, aside,
                    died)
                if outcome is not None:
                    return outcome
                if started:
                    died += 1
                else:
                    before_start += 1
                crashes, how = died + before_start, how_it_died(exitcode)
                log.warning("timer %s (%s): its quarantine process died (%s)%s, crash %d of "
                            "%d", timer_id, task, how, "" if started else " before starting it",
                            crashes, policy.max_crashes)
                if crashes >= policy.max_crashes:
                    where = f"{how} in a quarantine process on {self.where}"
                    return died_outcome(died, where, reruns, before_start)
        finally:
            self.held.unshare(token)

    def _target(self, task: str, fn: Callable[..., Any]) -> tuple[str, str | None, str, bytes]:
        """What the child resolves: the task path in the package, or a registered
        function pickled by reference (if it can be)."""
        pickled = b""
        if self.loader.registry.get(task) is fn:
            with contextlib.suppress(Exception):
                pickled = pickle.dumps(fn)
        return (self.loader.package, self.loader.search_path, task, pickled)

    def _start(self, process: Any) -> None:
        """Start a child (blocking): the fork server first, with the tasks package, if it
        was not started yet (or died)."""
        prestart(self.loader)
        process.start()

    def _process(self, target: tuple[str, str | None, str, bytes], args: Args,
                 cell: SharedUntil, died: int, sender: Connection, word_in: Connection, *,
                 gated: bool, aside: tuple[str, bytes] | None) -> Any:
        """A child's process, not started yet: what it resolves and its arguments, the
        run's context (``died``: its attempts so far), the logs, the lease it checks
        (``cell``, with this listener's margin), its ends of the pipes (its messages go
        into ``sender``, the word to start comes out of ``word_in`` when ``gated``) and
        ``aside``."""
        lease = (cell, self.held.margin)
        return _mp_context().Process(
            target=child_main, name="timers-quarantine", daemon=True,
            args=(*target, json.dumps(args), sender, dict(os.environ),
                  portable(timer_context.current_or_none(), died), ChildLogs.here(), lease,
                  word_in, gated, aside))

    async def _once(self, target: tuple[str, str | None, str, bytes], args: Args,
                    limit: float | None, cell: SharedUntil,
                    admit: Callable[[], Awaitable[Admission]] | None = None,
                    aside: tuple[str, bytes] | None = None, died: int = 0,
                    ) -> tuple[Outcome | None, int | None, bool]:
        """One child: its outcome, or None and its exit code if it died without one; and
        whether it started the task. ``died``: children of this run that died after they
        started it, each an attempt (the task's ``timers.current().attempt`` counts them).
        ``cell``: the run's lease as this listener knows it (:meth:`HeldRuns.share`), which
        the child checks before the task's code. With
        ``admit``, the child says when it has loaded the task and waits: the gate is asked
        then, and the child told to start (``go``) or to leave it (the gate's outcome)."""
        context = _mp_context()
        receiver, sender = context.Pipe(duplex=False)
        word_in, word_out = context.Pipe(duplex=False)
        process = self._process(target, args, cell, died, sender, word_in,
                                gated=admit is not None, aside=aside)
        first: asyncio.Future[Outcome | None] | None = None
        try:
            async with _loading_turns():
                await asyncio.to_thread(self._start, process)
                sender.close()
                word_in.close()
                first = asyncio.ensure_future(_message(process, receiver))
                await asyncio.wait({first}, timeout=LOADING_TURN)
            outcome = await first
            if outcome is LOADED and admit is not None:
                held = await _ask_gate(admit, word_out, process)
                if held is not None:
                    return held, process.exitcode, False
                outcome = await _message(process, receiver)
            # the timeout counts from when the task starts, not while the child loads it
            started = outcome is STARTED
            if started:
                try:
                    async with asyncio.timeout(limit):
                        outcome = await _message(process, receiver)
                except TimeoutError:
                    return Outcome("error", "TimeoutError",
                                   f"task did not finish within {limit} s"), None, True
            if outcome is not None:
                await _exited(process, EXIT_GRACE)
            return outcome, process.exitcode, started
        finally:
            await _stop_reading(first)  # (its readers go before the pipe closes)
            sender.close()
            word_out.close()  # (a child still running exits: see _watch_listener)
            _end(process, receiver)


async def _ask_gate(admit: Callable[[], Awaitable[Admission]], word_out: Connection,
                    process: Any) -> Outcome | None:
    """Ask the gate for a child that has loaded its task and waits, and tell the child: to
    start it (``go``, with the start window) or to leave it. Held back: the gate's outcome,
    once the child has exited (None: it starts)."""
    admission = await admit()
    held = admission.held
    with contextlib.suppress(*PARENT_GONE, OSError):
        word_out.send((GO, admission.start_by) if held is None else "no")
    if held is not None:
        await _exited(process, EXIT_GRACE)
    return held


async def _stop_reading(first: asyncio.Future[Outcome | None] | None) -> None:
    """Cancel the read of a child's first message if it still waits, and wait for it to
    end."""
    if first is not None and not first.done():
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first


async def _readable(*fds: int) -> None:
    """Until one of ``fds`` is readable (or closed)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        for fd in fds:
            loop.remove_reader(fd)


async def _message(process: Any, receiver: Connection) -> Outcome | None:
    """The next message of the child (:data:`LOADED`, :data:`STARTED` or its outcome), or
    None once it has exited without one."""
    await _readable(receiver.fileno(), process.sentinel)
    try:
        if receiver.poll():
            message = receiver.recv()
            if message == STARTED_WORD:
                return STARTED
            if message == LOADED_WORD:
                return LOADED
            kind, error_type, text, trace = message
            return Outcome(kind, error_type, text, trace)
    except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
        pass
    await _exited(process, None)
    return None


async def _exited(process: Any, limit: float | None) -> None:
    """Until the child has exited (at most ``limit`` seconds)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit):
            await _readable(process.sentinel)
    if process.exitcode is None:
        await asyncio.to_thread(process.join, 0.1)


def _end(process: Any, receiver: Connection) -> None:
    """Kill the child if it still runs (timeout, shutdown) and reap it."""
    receiver.close()
    if process.pid is None:
        return
    if process.exitcode is None:
        with contextlib.suppress(OSError):
            process.kill()
        process.join(1.0)
    with contextlib.suppress(ValueError):
        process.close()
