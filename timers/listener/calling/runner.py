"""Calling a task: plain functions in a bounded thread pool (:mod:`timers.listener.
thread_pool`), coroutines on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
import traceback
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any

from timers.exceptions import Late, Overran, Stale
from timers.listener.calling.thread_pool import Job, ThreadPool, task_name
from timers.model.encoding import Args
from timers.model.runs import OK, Outcome

if TYPE_CHECKING:
    from timers.listener.endings.journal import Journal


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_FITS: dict[tuple[Callable[..., Any], int | frozenset[str]], bool] = {}
"""Argument shapes known to fit a function: whether args bind depends only on how many
positional args there are, or on which keyword names, so each shape is checked once."""
_MAX_FITS = 10_000


def _bind_error(fn: Callable[..., Any], args: Args) -> str | None:
    shape: int | frozenset[str] = (
        frozenset(args) if isinstance(args, dict) else len(args or ())
    )
    if _FITS.get((fn, shape)):
        return None
    signature = _signature(fn)
    if signature is None:
        return None
    try:
        if isinstance(args, dict):
            signature.bind(**args)
        else:
            signature.bind(*(args or ()))
    except TypeError as exc:
        return f"args {args!r:.200} do not fit {getattr(fn, '__name__', fn)}{signature}: {exc}"
    if len(_FITS) >= _MAX_FITS:
        _FITS.clear()
    _FITS[(fn, shape)] = True
    return None


class Turn:
    """One followed run: its pool job once its function is handed to a thread, and
    whether it has ended."""

    __slots__ = ("ended", "job", "revoked", "solo", "started", "taken_back")

    def __init__(self) -> None:
        self.job: Job | None = None
        self.started = asyncio.Event()
        """Set once its function is handed to a thread, or once it ended without that."""
        self.ended = asyncio.Event()
        self.revoked = False
        """Asked back before it started (the run before it never started: its gate held
        it): it waits in its key's queue again."""
        self.taken_back = False
        """Revoked because the run before it was held back by its gate, which took it back
        into its key's queue itself (``gate.lua`` ``take_back_next``): no ending to write."""
        self.solo = False
        """Its run may find in its thread that it is too late to start (a rate's run with
        a start window): the run next in line waits for it to end, never chained in that
        thread (whose job may end without calling it)."""

    def handed_to_thread(self, job: Job) -> None:
        self.job = job
        self.started.set()


class Runner:
    """Runs task callables; never raises: every ending is an :class:`Outcome`.

    ``on_free`` is called on the event loop when a thread stuck past its timeout returns
    and so frees its task slot. ``busy``: whether the process's CPU bounds its runs (then
    plain functions' results are handed back in longer batches: see :class:`ThreadPool`).
    """

    def __init__(self, threads: int, on_free: Callable[[], None] | None = None,
                 busy: Callable[[], bool] | None = None) -> None:
        self._pool = ThreadPool(threads, on_free, busy)
        self._on_loop_as: dict[Callable[..., Any], tuple[CodeType, str] | None] = {}
        """Each function called so far: None if a plain function (called in a thread),
        else an ``async def``'s code and name (:meth:`async_tasks`)."""

    def async_tasks(self) -> list[tuple[CodeType, str]]:
        """The code and name of each ``async def`` task called so far: one whose code is
        on the event loop's stack is running there (for naming what blocks the loop; no
        count of the running ones is kept per run)."""
        return [key for key in list(self._on_loop_as.values()) if key is not None]

    def on_loop(self, fn: Callable[..., Any]) -> bool:
        """Whether ``fn`` is called on the event loop (an ``async def``), not in a thread."""
        try:
            return self._on_loop_as[fn] is not None
        except KeyError:
            return self._learn(fn) is not None

    def _learn(self, fn: Callable[..., Any]) -> tuple[CodeType, str] | None:
        loop_key = self._on_loop_as[fn] = (
            (getattr(fn, "__code__", None) or _NO_CODE, task_name(fn))
            if inspect.iscoroutinefunction(fn) else None)
        return loop_key

    @property
    def stuck(self) -> int:
        """Threads still running a function past its timeout: each holds a task slot."""
        return self._pool.stuck

    async def call(self, fn: Callable[..., Any], args: Args, limit: float | None = None,
                   turn: Turn | None = None, after: Turn | None = None,
                   fence: Callable[[], bool] | None = None, prompt: bool = False,
                   note: tuple[str, bytes] | None = None,
                   start_by: float | None = None) -> Outcome:
        """Call ``fn`` with ``args``; with ``limit`` (seconds), stop waiting after that long.

        A coroutine is cancelled at its timeout. A plain function's timeout counts from when
        a thread starts it, not while it waits for one; a thread cannot be stopped, so the
        run is reported as timed out and the function goes on in its thread, which keeps its
        slot (see :attr:`stuck`) until it returns.

        ``turn``: this run's, told the job its function runs in. ``after``: the turn of the
        run this one is next in line after (:mod:`timers.listener.flow.turns`): a plain function
        starts in that run's thread as its function returns, a coroutine once it ended.
        ``fence``: whether the run's lease still holds, asked right before a plain function
        is called in its thread (and before a coroutine starts): if not, :data:`STALE`.
        ``prompt``: a plain function's result is handed back at once, never gathered (a
        run through a flow limit: its ending frees a slot another run may wait for).
        ``note``: a plain function's run journals it in its thread as it returns (see
        :meth:`ThreadPool.submit`). ``start_by`` (monotonic): a rate's run that reaches its
        call later is not called: :data:`LATE` (its slot is given back).
        """
        if (problem := _bind_error(fn, args)) is not None:
            return Outcome("bad_args", "TypeError", problem)
        positional, keywords = ([], args) if isinstance(args, dict) else (args or [], {})
        try:
            is_async = self._on_loop_as[fn] is not None
        except KeyError:
            is_async = self._learn(fn) is not None
        if after is not None:
            if await _revoked_after(after, is_async, turn):
                return REVOKED
            after = None if after.solo else after
        if is_async:
            return await _on_loop(fn, positional, keywords, limit, fence, start_by)
        job = self._pool.submit(fn, list(positional), dict(keywords),
                                after.job if after else None, turn is not None, fence, prompt,
                                note, turn.job if turn is not None else None, start_by)
        return await self._in_thread(job, limit, turn)

    async def _in_thread(self, job: Job, limit: float | None, turn: Turn | None) -> Outcome:
        """A plain function's run, in a thread (which asks its fence and its start window);
        a coroutine it returns is awaited here. ``turn``'s run is told its job."""
        if turn is not None:
            turn.handed_to_thread(job)
        try:
            try:
                result = await (job.future if limit is None else self._wait(job, limit))
            except asyncio.CancelledError:
                self._pool.withdraw(job)  # not started yet: no thread takes it up now
                raise
            if result is not None and inspect.isawaitable(result):
                async with asyncio.timeout(limit):
                    await result
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a task's failure is data
            return _ended_by(exc, limit, False)
        return OK

    async def _wait(self, job: Job, limit: float) -> Any:
        """The job's result, or :class:`Overran` once it has run ``limit`` s in a thread;
        a job still queued for a thread is not timed."""
        while True:
            started = job.started
            wait = limit if started is None else started + limit - time.monotonic()
            if wait <= 0 or job.future.done():
                break
            await asyncio.wait([job.future], timeout=wait)
        if job.future.done():
            return job.future.result()
        self._pool.abandon(job)
        raise Overran

    def let_follower_go(self, turn: Turn) -> None:
        """``turn``'s run, found stale in its thread, is given up (another listener took it
        over): the run chained after it is queued now, and asks its own fence."""
        if turn.job is not None:
            self._pool.let_go(turn.job)

    def use_journal(self, journal: Journal | None) -> None:
        """Journal the notes of plain functions' runs there
        (:mod:`timers.listener.endings.journal`)."""
        self._pool.journal = journal

    def shutdown(self) -> None:
        """Let idle threads end; threads still running a task end when it returns."""
        self._pool.shutdown()


_NO_CODE = (lambda: None).__code__
_NO_DEADLINE = contextlib.nullcontext()


async def _revoked_after(after: Turn, is_async: bool, turn: Turn | None) -> bool:
    """Wait for the run before this one (``after``: a plain function starts as its function
    returns, a coroutine once it ended, after a run that must start alone once it ended);
    whether this run was asked back meanwhile (``turn`` revoked)."""
    await (after.ended if is_async else after.started).wait()
    if after.solo:
        await after.ended.wait()
    return turn is not None and turn.revoked


async def _on_loop(fn: Callable[..., Any], positional: list[Any] | tuple[Any, ...],
                   keywords: dict[str, Any], limit: float | None,
                   fence: Callable[[], bool] | None, start_by: float | None) -> Outcome:
    """A coroutine's run, on the event loop: its fence and its start window are asked in
    the same step of the loop as its first line; it is cancelled at its timeout."""
    if fence is not None and not fence():
        return STALE
    if start_by is not None and time.monotonic() > start_by:
        return LATE
    deadline = asyncio.timeout(limit) if limit is not None else None
    try:
        async with deadline or _NO_DEADLINE:
            await fn(*positional, **keywords)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # a task's failure is data
        return _ended_by(exc, limit, deadline is not None and deadline.expired())
    return OK


def _ended_by(exc: BaseException, limit: float | None, expired: bool) -> Outcome:
    """The outcome of a run that raised ``exc``: not started (:data:`STALE`, :data:`LATE`),
    timed out, or failed."""
    if isinstance(exc, Stale):
        return STALE
    if isinstance(exc, Late):
        return LATE
    if isinstance(exc, Overran) or expired:
        return Outcome("error", "TimeoutError", f"task did not finish within {limit} s")
    return Outcome("error", type(exc).__qualname__, str(exc),
                   "".join(traceback.format_exception(exc)))

REVOKED = Outcome("revoked", "", "asked back before it started: the run before it did not "
                  "start: waits for its key again")
LATE = Outcome("late", "", "it reached its call past its rate slot's start window (the "
               "listener was busy): not started, its slot given back; its timer asks its "
               "rate again")
STALE = Outcome("stale", "", "its lease was not known to hold at its start (the listener "
                "stalled): not started before it is revalidated")
