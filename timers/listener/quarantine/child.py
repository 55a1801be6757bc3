"""The child's side of quarantine (:mod:`timers.listener.quarantine.parent`): what a quarantine
child process does with the one run it is given.

It logs as its listener does (:class:`ChildLogs`), takes the listener's environment as it
is now, resolves the task as the listener does, says it has loaded it and, for a gated run,
waits for the listener's word (:data:`GO`), then says it starts and calls the task under
the lease the listener shares with it (:func:`~timers.listener.leases.fresh_in`), and
sends the outcome back over its pipe. It exits the moment its listener goes away
(:data:`LISTENER_GONE_EXIT`). The messages it sends: :data:`LOADED_WORD`,
:data:`STARTED_WORD`, then the outcome as a tuple.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NamedTuple

from timers.listener.calling import context as timer_context
from timers.listener.calling.loader import TaskLoader
from timers.listener.calling.runner import Runner
from timers.listener.endings.journal import note_aside
from timers.listener.leases import SharedUntil, fresh_in
from timers.listener.quarantine import fork_server
from timers.listener.supervision.orphans import ask_for_signal_on_parent_death
from timers.listener.tuning import event_loop
from timers.logs import IDENTITY, JsonFormatter, LogFormat, configure
from timers.model.runs import MAX_MESSAGE, MAX_TRACEBACK, Outcome

log = logging.getLogger("timers.listener")

GO = "go"
"""The listener's word to a gated child: ``(GO, start_by)``, start the task, by
``start_by`` (monotonic, None: whenever) if a rate let it go (anything else: leave it)."""

LOADED_WORD = "loaded"
"""A gated child's first message: the task is loaded, and the child waits for the word."""

STARTED_WORD = "started"
"""The child's message that the task is loaded and starts now."""


@dataclass(frozen=True)
class ChildLogs:
    """How the listener logs (level, format, its id), for its quarantine children to log
    the same way: their lines, and a task's, read like the listener's own."""

    level: str
    format: LogFormat
    listener: str | None

    @classmethod
    def here(cls) -> ChildLogs:
        """This process's: JSON if a handler of the root logger writes JSON, else text."""
        root = logging.getLogger()
        json_out = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
        return cls(logging.getLevelName(root.getEffectiveLevel()),
                   "json" if json_out else "text", IDENTITY.listener)

    def configure(self) -> None:
        """Log in this process as the listener does, as its quarantine child."""
        configure(self.level, self.format, role="quarantine")
        IDENTITY.listener = self.listener


PARENT_GONE = (BrokenPipeError, ConnectionResetError, EOFError)
"""What writing to the pipe raises once the listener's end is closed."""


def child_main(package: str, search_path: str | None, task: str, pickled: bytes, args_json: str,
           sender: Connection, environ: dict[str, str],
           timer: timer_context.TimerContext | None = None,
           logs: ChildLogs | None = None,
           lease: tuple[SharedUntil, float] | None = None,
           word: Connection | None = None, gated: bool = False,
           aside: tuple[str, bytes] | None = None) -> None:
    """In the child: resolve the task as the listener does, run it, send the outcome.

    The fork server was started at the first quarantined run and kept the environment of
    that moment: the task gets the listener's environment as it is now, as in-process,
    and its :func:`timers.current` context. It logs as the listener does (``logs``). If the
    listener went away (its end of the pipe closed: a timeout, a shutdown), the child says
    so in one line and exits: nobody is left to read an outcome, and a task not started
    yet is not started. ``lease``: the cell the listener keeps the run's lease in and the
    margin it must hold by (:func:`fresh_in`); the task starts only while it does.
    ``word``: the listener's pipe to the child: a gated run's word to start comes from it
    (``gated``, :func:`_waits_for_word`), and its closing says the listener went away
    (:func:`_watch_listener`). ``aside``: where to note that the task returned before
    saying so (:func:`~timers.listener.endings.journal.note_aside`): durable before the listener,
    paused or dying, could lose the outcome on its way.
    """
    os.environ.clear()
    os.environ.update(environ)
    ask_for_signal_on_parent_death(signal.SIGKILL)
    if logs is not None:
        logs.configure()
    held = None if lease is None else functools.partial(fresh_in, *lease)
    try:  # on the listener's kind of event loop ($TIMERS_LOOP came with the environment)
        go = None if word is None else functools.partial(_go, sender, word, gated)
        outcome = event_loop.run(run_in_child(package, search_path, task, pickled,
                                               args_json, lambda: sender.send(STARTED_WORD),
                                               timer, held, go, aside),
                                 _loop_of_listener())
        sender.send((outcome.kind, outcome.error_type, outcome.message[:MAX_MESSAGE],
                     outcome.traceback[-MAX_TRACEBACK:]))
    except PARENT_GONE as exc:
        log.warning("quarantine process of task %s: the listener went away before it "
                    "read the outcome (%s: %s); exiting", task, type(exc).__name__, exc,
                    extra={"task": task})
    finally:
        with contextlib.suppress(OSError):
            sender.close()


def _go(sender: Connection, word: Connection, gated: bool) -> Go:
    """Right before the start: wait for the listener's word if the run is ``gated``
    (leave it when not given), then watch the listener for the rest of the run."""
    go = _waits_for_word(sender, word) if gated else Go(True, None)
    if go.start:
        _watch_listener(word)
    return go


class Go(NamedTuple):
    """The listener's word to a child: whether to start the task, and by when (monotonic,
    None: whenever)."""

    start: bool
    start_by: float | None


def _waits_for_word(sender: Connection, word: Connection) -> Go:
    """Say the task is loaded and wait for the listener's word: start it (it asked the
    run's flow gate just now), or leave it (held, or the listener went away)."""
    sender.send(LOADED_WORD)
    try:
        said = word.recv()
    except PARENT_GONE:
        return Go(False, None)
    if isinstance(said, tuple) and len(said) == 2 and said[0] == GO:
        return Go(True, None if said[1] is None else float(said[1]))
    return Go(False, None)


LISTENER_GONE_EXIT = 75
"""The exit status of a child whose listener went away while it ran its task."""


def _watch_listener(word: Connection) -> None:
    """Exit the moment the listener's end of ``word`` closes while the task runs: the
    listener died (a ``kill -9``, a poison in one of its threads). Its process is the fork
    server's child, not the listener's, so no parent-death signal tells it. Finished
    anyway, the run's outcome would have nobody to read or journal it, and the run, its
    lease lapsed, would run again: a finished run run twice (the chaos checker's Cluster
    run). Cut here, it is a run its listener's death cut, run again once."""
    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                word.recv()
        os._exit(LISTENER_GONE_EXIT)

    threading.Thread(target=watch, name="timers-listener-watch", daemon=True).start()


def _loop_of_listener() -> str:
    """The listener's kind of event loop; asyncio's if ``$TIMERS_LOOP`` names none that
    this process can have (a listener started through the API does not check it)."""
    try:
        return event_loop.chosen_loop()
    except ValueError:
        return "asyncio"


async def run_in_child(package: str, search_path: str | None, task: str, pickled: bytes,
                        args_json: str, started: Callable[[], None],
                        timer: timer_context.TimerContext | None = None,
                        held: Callable[[], bool] | None = None,
                        go: Callable[[], Go] | None = None,
                        aside: tuple[str, bytes] | None = None) -> Outcome:
    """The child's run (no process of its own: a test calls it as it is): resolve the
    task, wait for the word to start it (``go``, when the run is gated: no word leaves it
    unstarted), say it starts, and call it under the fence ``held`` (None: unfenced),
    which the task's ``timers.current().still_held()`` reads too; :data:`~timers.listener.
    runner.STALE` and nothing called when the lease is not known to hold at its start,
    :data:`~timers.listener.calling.runner.LATE` when it comes past the word's start window. A
    task that returned is noted ``aside`` (:func:`~timers.listener.endings.journal.note_aside`)
    before the outcome goes back."""
    if timer is not None:  # the run copies it into the task's context
        timer_context.enter(dataclasses.replace(timer, lease_check=held))
    try:
        if pickled:
            fn = pickle.loads(pickled)
        else:
            fork_server.forget_other_package(package, search_path)
            loader = TaskLoader(package, None, search_path)
            loader.load()
            fn = loader.resolve(task)
    except Exception as exc:
        return Outcome("refused", type(exc).__qualname__, f"in a quarantine process: {exc}")
    start_by = None
    if go is not None:
        start, start_by = go()
        if not start:
            return NOT_STARTED
    started()
    runner = Runner(1)
    try:
        outcome = await runner.call(fn, json.loads(args_json), fence=held, start_by=start_by)
    finally:
        runner.shutdown()
    if aside is not None and outcome.ok:
        note_aside(*aside)  # durable before the listener, paused or dying, can lose it
    return outcome


NOT_STARTED = Outcome("held", "", "the listener did not give the word to start it")
"""What a gated child whose run was held reports (nobody reads it: the listener ended the
run with its gate's outcome)."""


def portable(timer: timer_context.TimerContext | None,
             died: int = 0) -> timer_context.TimerContext | None:
    """The context a child gets: without the parent's lease check, a function that cannot
    cross processes (the child checks the shared lease instead: :func:`run_in_child`), and
    its attempt past the ``died`` children of the run that started it and died."""
    if timer is None:
        return None
    return dataclasses.replace(timer, lease_check=None, attempt=timer.attempt + died)
