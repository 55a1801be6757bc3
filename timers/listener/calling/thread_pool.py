"""The thread pool that runs plain task functions and hands their results to the event
loop: a wake of the loop per batch of results, and longer batches while the process is busy
(its CPU bounds the runs), so the interpreter changes hands fewer times a run."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from timers.exceptions import Late, Stale

if TYPE_CHECKING:
    from timers.listener.endings.journal import Journal

log = logging.getLogger("timers.listener")


class Job:
    """A call handed to the pool; ``started`` is set (monotonic) when a thread takes it.

    ``then``: a job queued to start in the same thread the moment this one's function
    returns (a run next in line on its concurrency key slot); the pool's lock guards it
    and ``finished``."""

    __slots__ = ("abandoned", "args", "cancelled", "context", "ended", "fence", "finished",
                 "fn", "future", "guarded", "kwargs", "note", "prompt", "stale", "start_by",
                 "started", "then")

    def __init__(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: list[Any],
                 kwargs: dict[str, Any]) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs
        self.context = contextvars.copy_context()  # the caller's, e.g. timers.current()
        self.started: float | None = None
        self.ended: float | None = None
        """Monotonic, when its function returned (a guarded job's)."""
        self.abandoned = self.cancelled = self.finished = self.guarded = False
        self.stale = False
        """Its fence failed in the thread, so it was not called: the run is not over (it
        is revalidated and called again, or given up), and the job chained after it waits
        for that (:meth:`ThreadPool.submit` ``resumes``, :meth:`ThreadPool.let_go`)."""
        self.prompt = False
        """Its result wakes the loop at once, even while results are gathered
        (:class:`ThreadPool`): a run through a flow limit, whose ending may free a slot
        another run waits for."""
        self.then: Job | None = None
        self.fence: Callable[[], bool] | None = None
        """Checked in the thread right before the call: False (the run's lease is not known
        to hold, e.g. after the process was paused) and the call is not made (:class:`Stale`)."""
        self.start_by: float | None = None
        """Monotonic: a rate's run reaching its call later is not called (:class:`Late`)."""
        self.note: tuple[str, bytes] | None = None
        """(run token, journal line): appended to the pool's journal by the thread the
        moment the function returns normally (:mod:`timers.listener.endings.journal`)."""


def task_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a task function, for log lines."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


DELIVERY_GATHER_S = 0.005
"""While the process is busy, how long results wait to be handed to the event loop
together (:class:`ThreadPool`)."""


class ThreadPool:
    """Threads that run plain task functions and hand results back to the event loop.

    Unlike ``run_in_executor``, which wakes the event loop once per finished call, the
    threads queue their results and wake the loop once per batch: under a burst of due
    timers that saves much of a call's cost
    (figures: bench/FINDINGS.md, "GIL hand-overs per run"). Threads start as they are
    needed, up to ``size``, and are daemons: a task still running at exit does not hold
    the process.

    While ``busy()`` says the process's CPU bounds its runs, the batches are made longer:
    the first result after a quiet spell still wakes the loop at once, and those that
    follow within :data:`DELIVERY_GATHER_S` are handed over together when it ends, or
    once :attr:`enough` are waiting (a ``prompt`` job's at once). Each wake of the loop
    is a hand-over of the interpreter between threads, and in a burst of short plain
    tasks those hand-overs, not the Python either side runs, were most of a run's CPU; a
    result waiting a few ms costs nothing there, as its run's ending would wait for the
    CPU anyway. A process whose tasks wait (on the network, a sleep) is not busy: each
    result wakes the loop.

    A job whose caller gave up on it at its timeout (:meth:`abandon`) still holds its
    thread: it counts in :attr:`stuck` until the function returns, and ``on_free`` is
    called (on the loop) when it does.
    """

    def __init__(self, size: int, on_free: Callable[[], None] | None = None,
                 busy: Callable[[], bool] | None = None) -> None:
        self.size = size
        self.on_free = on_free
        self.busy = busy
        self.enough = max(1, size // 4)
        """Results waiting that wake the loop even while they are gathered: as many as the
        free slots a claim in a backlog waits for (:meth:`timers.listener.finding.claimer.Claimer.
        gather_slots`); so a pool of fewer than 8 threads never gathers."""
        self.stuck = 0
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._results: collections.deque[tuple[Job, bool, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._wake_pending = False
        """A wake of the loop for the results is on its way."""
        self._gathering = False
        """Results are handed over by :attr:`_timer` (the process is busy): a thread
        wakes the loop only for a prompt job's."""
        self._timer: asyncio.TimerHandle | None = None
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.journal: Journal | None = None
        """Where a job's note goes as its function returns (None: no journal)."""

    def submit(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any],
               after: Job | None = None, guarded: bool = False,
               fence: Callable[[], bool] | None = None, prompt: bool = False,
               note: tuple[str, bytes] | None = None, resumes: Job | None = None,
               start_by: float | None = None) -> Job:
        """Queue a call; with ``after`` (a job not finished yet), start it in that job's
        thread the moment that job's function returns. ``guarded``: it may be withdrawn
        (:meth:`withdraw`) up to the moment a thread starts it. ``fence``: asked in the
        thread right before the call; False and the call is not made (:class:`Stale`).
        ``prompt``: its result is handed to the loop at once, never gathered. ``note``:
        journaled in the thread once the function returns (not if it raised or returned
        an awaitable: its run has not ended yet). ``resumes``: the same run's job that was
        stale; the job chained after that one follows this one now. ``start_by``
        (monotonic): a thread taking it up later does not call it (:class:`Late`); nothing
        is chained after such a job (:attr:`timers.listener.calling.runner.Turn.solo`)."""
        loop = self._loop = asyncio.get_running_loop()
        job = Job(loop.create_future(), fn, args, kwargs)
        job.guarded, job.fence, job.prompt, job.note = guarded, fence, prompt, note
        job.start_by = start_by
        if resumes is not None:
            with self._lock:
                if resumes.stale:
                    job.then, resumes.then, resumes.stale = resumes.then, None, False
        if after is not None:
            with self._lock:
                if (after.stale and after.then is None) or not (
                        after.finished or after.abandoned or after.then):
                    after.then = job
                    return job
        self._queue(job)
        return job

    def let_go(self, job: Job) -> None:
        """A stale ``job`` is given up (its run was taken over): the job chained after it,
        if any, is queued now (its own fence decides whether it starts)."""
        with self._lock:
            chained = job.then if job.stale else None
            job.then, job.stale = None, False
        if chained is not None:
            self._queue(chained)

    def _queue(self, job: Job) -> None:
        with self._lock:
            start = self._idle == 0 and len(self._threads) < self.size
            if not start:
                self._idle -= 1 if self._idle else 0
        if start:
            thread = threading.Thread(target=self._work, name="timers-task", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._jobs.put(job)

    def _work(self) -> None:
        job: Job | None = None
        while True:
            job = job or self._jobs.get()
            if job is None:
                return
            if job.guarded or job.cancelled:
                if not self._take(job):
                    job = self._next_of(job)
                    continue
            else:
                job.started = time.monotonic()
            result: tuple[Job, bool, Any]
            stale = job.fence is not None and not job.fence()
            if stale:  # not called: the loop revalidates the run; what follows it waits
                result = (job, False, Stale())
            elif job.start_by is not None and time.monotonic() > job.start_by:
                result = (job, False, Late())  # not called: the run gives its slot back
            else:
                try:
                    value = job.context.run(job.fn, *job.args, **job.kwargs)
                except BaseException as exc:  # handed to the awaiting coroutine
                    result = (job, False, exc)
                else:
                    if job.note is not None and self.journal is not None and (
                            value is None or not inspect.isawaitable(value)):
                        self.journal.append(*job.note)  # before anything else: durable
                    result = (job, True, value)
            job, wake = self._finished(result, stale)
            loop = self._loop
            if wake and loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:
                    return  # the loop closed under us: nobody waits any more

    def _take(self, job: Job) -> bool:
        """Mark ``job`` started, unless it was withdrawn (then it is skipped): the check
        and the mark are one step, so a withdrawal either wins or fails."""
        with self._lock:
            if job.cancelled:
                return False
            job.started = time.monotonic()
            return True

    def withdraw(self, job: Job) -> bool:
        """Make sure a job never starts; False if a thread has started it already. Only a
        guarded job's start is checked under the lock: another job may still start if a
        thread is just taking it up (its caller is gone then, as at shutdown)."""
        with self._lock:
            if job.started is not None:
                return False
            job.cancelled = True
            return True

    def _next_of(self, job: Job) -> Job | None:
        """A job skipped unrun (withdrawn): what this thread runs next."""
        with self._lock:
            return self._done(job)

    def _finished(self, result: tuple[Job, bool, Any],
                  stale: bool = False) -> tuple[Job | None, bool]:
        """Hand a result back. Returns the job chained after it, which this thread runs
        next (none after a ``stale`` job: it stays chained), and whether to wake the loop
        for the result."""
        job = result[0]
        if job.guarded and not stale:  # a run that may be followed: the one next in line
            job.ended = time.monotonic()  # starts now
        with self._lock:
            self._results.append(result)
            # a stale job's result goes at once: its revalidation holds a run up
            wake = not self._wake_pending and (stale or job.prompt or not self._gathering
                                               or len(self._results) >= self.enough)
            if wake:
                self._wake_pending = True
            if stale:  # it keeps its chained job: the call after revalidation takes it
                job.stale = job.finished = True
                self._idle += 1
                return None, wake
            return self._done(job), wake

    def _done(self, job: Job) -> Job | None:
        """(Under the lock.) ``job`` is over in its thread: the job chained after it,
        which that thread runs next; without one, the thread is idle."""
        job.finished = True
        chained, job.then = job.then, None
        if chained is None:
            self._idle += 1
        return chained

    def _deliver(self, timed: bool = False) -> None:
        """(On the loop.) Hand the results queued to their callers; ``timed``: called by
        :attr:`_timer`. While the process is busy, the results that come next are
        gathered until the timer (see the class)."""
        busy = self.busy is not None and self.busy()
        with self._lock:
            self._wake_pending = False
            ready = list(self._results)
            self._results.clear()
            self._gathering = gather = busy and bool(ready)
        if timed:
            self._timer = None
        if gather and self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(DELIVERY_GATHER_S, self._deliver, True)
        freed = 0
        for job, ok, value in ready:
            if job.abandoned:
                freed += 1
                log.info("%s returned %.1f s after it started, past its timeout",
                         task_name(job.fn), time.monotonic() - (job.started or 0.0))
            if job.future.done():
                continue
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)
        if freed:
            self._set_stuck(self.stuck - freed)
            if self.on_free is not None:
                self.on_free()

    def abandon(self, job: Job) -> None:
        """The caller stops waiting for a running job: its thread is stuck until it ends,
        and a job chained after it is queued for another thread."""
        with self._lock:
            job.abandoned = True
            chained, job.then = job.then, None
        if chained is not None:
            self._queue(chained)
        self._set_stuck(self.stuck + 1, job)

    def _set_stuck(self, count: int, job: Job | None = None) -> None:
        self.stuck = count
        if job is not None:
            log.warning("%d thread(s) stuck past their timeout (latest: %s): each keeps its "
                        "task slot until its function returns", count, task_name(job.fn))
        elif count:
            log.warning("%d thread(s) stuck past their timeout", count)
        else:
            log.warning("no thread stuck past its timeout any more")

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
