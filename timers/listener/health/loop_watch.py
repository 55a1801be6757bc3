"""Noticing an event loop that something blocks, and naming what.

An ``async def`` task that calls blocking code (``time.sleep``, a sync HTTP call) stops
every other timer of the listener: none starts, no ending is written. A thread posts a
probe to the loop every ``threshold / 4`` seconds; when one has waited more than
``threshold`` seconds it reads the loop thread's stack and logs, at WARNING, the task whose
code is on it, and again when the loop runs once more.

While no run has been going for :data:`REST_AFTER` seconds the thread rests, and the
first run to start wakes it (:meth:`LoopWatch.work_started`): an idle listener's loop is
not woken four times a second, which was most of its CPU at rest
(figures: bench/FINDINGS.md, "An idle listener's CPU").
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import CodeType, FrameType

log = logging.getLogger("timers.listener")

DEFAULT_THRESHOLD = 1.0
REST_AFTER = 1.0
"""Seconds with no run going after which the watch stops probing until one starts."""
REST_CHECK = 5.0
"""While resting, how often the watch looks whether runs are going anyway."""


def blocker(frame: FrameType | None, tasks: Iterable[tuple[CodeType, str]]) -> str:
    """What ``frame`` (the innermost of a stack) is running: the task whose code is on the
    stack, and where the stack is."""
    if frame is None:
        return "unknown code"
    where = f"{frame.f_code.co_name} at {frame.f_code.co_filename}:{frame.f_lineno}"
    names = dict(tasks)
    current: FrameType | None = frame
    while current is not None:
        name = names.get(current.f_code)
        if name is not None:
            return f"task {name} (in {where})"
        current = current.f_back
    return f"code that is not a task ({where})"


class LoopWatch:
    """Warns when ``loop`` has not run a callback for ``threshold`` seconds.

    ``running`` gives the code and name of the ``async def`` tasks that may be on the loop
    (those called so far: the innermost whose code is on the loop's stack is named).
    ``busy``: whether a run is going (read from the watch's thread); None: always
    probe.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 running: Callable[[], Iterable[tuple[CodeType, str]]],
                 threshold: float = DEFAULT_THRESHOLD,
                 busy: Callable[[], bool] | None = None) -> None:
        self.loop = loop
        self.running = running
        self.threshold = threshold
        self.busy = busy
        self.resting = False
        """The watch probes no more until a run starts (:meth:`work_started`)."""
        self._work = threading.Event()
        self._loop_thread = threading.get_ident()  # built on the loop's thread
        self._stop = threading.Event()
        self._answered = threading.Event()
        self._thread = threading.Thread(target=self._main, name="timers-loop-watch",
                                        daemon=True)

    def start(self) -> LoopWatch:
        self._thread.start()
        return self

    def work_started(self) -> None:
        """A run started with none going (called on the loop): a resting watch probes
        again. Costs a flag read otherwise."""
        if self.resting:
            self.resting = False
            self._work.set()

    def close(self) -> None:
        self._stop.set()
        self._work.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _main(self) -> None:
        blocked_since: float | None = None
        idle_since: float | None = None
        while not self._stop.is_set():
            self._answered.clear()
            posted = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(self._answered.set)
            except RuntimeError:
                return  # the loop is closed
            while not self._answered.wait(self.threshold / 4):
                if self._stop.is_set():
                    return
                if blocked_since is None and time.monotonic() - posted > self.threshold:
                    blocked_since = posted
                    self._report(time.monotonic() - posted)
            if blocked_since is not None:
                log.warning("event loop ran again after %.1f s blocked",
                            time.monotonic() - blocked_since)
                blocked_since = None
            if self.busy is None or self.busy():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= REST_AFTER:
                self._rest()
                idle_since = None
                continue
            self._stop.wait(self.threshold / 4)

    def _rest(self) -> None:
        """Wait until a run starts (or the watch closes); a run that started as the rest
        began is seen by the check after the flag is up."""
        assert self.busy is not None
        self._work.clear()
        self.resting = True
        while not self._stop.is_set() and not self.busy():
            if self._work.wait(REST_CHECK):
                break
        self.resting = False

    def _report(self, seconds: float) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        try:
            tasks = list(self.running())
        except RuntimeError:  # changed under us: the loop moved on
            tasks = []
        what = blocker(frame, tasks)
        log.warning("event loop blocked for %.1f s by %s: no other timer starts or ends "
                    "meanwhile (leases are still renewed); an async task must not call "
                    "blocking code: await it, or make the task a plain def to run it in a "
                    "thread", seconds, what)
