"""Calling a task: plain functions in a bounded thread pool, coroutines on the event loop."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any

from timers.encoding import Args
from timers.runs import OK, Outcome


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


_Job = tuple[asyncio.Future[Any], Callable[..., Any], list[Any], dict[str, Any]]


class ThreadPool:
    """Threads that run plain task functions and hand results back to the event loop.

    Unlike ``run_in_executor``, which wakes the event loop once per finished call, the
    threads queue their results and wake the loop once per batch: under a burst of due
    timers that halves the cost of a call. Threads start as they are needed, up to
    ``size``, and are daemons: a task still running at exit does not hold the process.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._results: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = (
            collections.deque()
        )
        self._lock = threading.Lock()
        self._wake_pending = False
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
               ) -> asyncio.Future[Any]:
        loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            start = self._idle == 0 and len(self._threads) < self.size
            if not start:
                self._idle -= 1 if self._idle else 0
        if start:
            thread = threading.Thread(target=self._work, name="timers-task", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args, kwargs = job
            try:
                result: tuple[asyncio.Future[Any], bool, Any] = (future, True, fn(*args, **kwargs))
            except BaseException as exc:  # handed to the awaiting coroutine
                result = (future, False, exc)
            with self._lock:
                self._results.append(result)
                self._idle += 1
                wake = not self._wake_pending
                self._wake_pending = True
            loop = self._loop
            if wake and loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:
                    return  # the loop closed under us: nobody waits any more

    def _deliver(self) -> None:
        with self._lock:
            self._wake_pending = False
            ready = list(self._results)
            self._results.clear()
        for future, ok, value in ready:
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


class Runner:
    """Runs task callables; never raises: every ending is an :class:`Outcome`."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPool(threads)
        self._is_async: dict[Callable[..., Any], bool] = {}

    async def call(
        self, fn: Callable[..., Any], args: Args, limit: float | None = None
    ) -> Outcome:
        """Call ``fn`` with ``args``; with ``limit`` (seconds), stop waiting after that long.

        A coroutine is cancelled at its timeout. A thread cannot be stopped: the run is
        reported as timed out and the function goes on in its thread until it returns.
        """
        problem = _bind_error(fn, args)
        if problem is not None:
            return Outcome("bad_args", "TypeError", problem)
        positional, keywords = ([], args) if isinstance(args, dict) else (args or [], {})
        is_async = self._is_async.get(fn)
        if is_async is None:
            is_async = self._is_async[fn] = inspect.iscoroutinefunction(fn)
        deadline = asyncio.timeout(limit) if limit is not None else None
        try:
            async with deadline or contextlib.nullcontext():
                if is_async:
                    await fn(*positional, **keywords)
                else:
                    result = await self._pool.submit(fn, list(positional), dict(keywords))
                    if inspect.isawaitable(result):
                        await result
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a task's failure is data
            if deadline is not None and deadline.expired():
                return Outcome("error", "TimeoutError", f"task did not finish within {limit} s")
            return Outcome(
                "error",
                type(exc).__qualname__,
                str(exc),
                "".join(traceback.format_exception(exc)),
            )
        return OK

    def shutdown(self) -> None:
        """Let idle threads end; threads still running a task end when it returns."""
        self._pool.shutdown()
