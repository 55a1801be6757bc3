"""Calling a task: plain functions in a bounded thread pool, coroutines on the event loop."""

from __future__ import annotations

import asyncio
import functools
import inspect
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from timers.encoding import Args
from timers.runs import OK, Outcome


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _bind_error(fn: Callable[..., Any], args: Args) -> str | None:
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
    return None


class Runner:
    """Runs task callables; never raises: every ending is an :class:`Outcome`."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="timers-task")
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
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                if is_async:
                    await fn(*positional, **keywords)
                else:
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(
                        self._pool, functools.partial(fn, *positional, **keywords)
                    )
                    if inspect.isawaitable(result):
                        await result
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a task's failure is data
            if deadline.expired():
                return Outcome("error", "TimeoutError", f"task did not finish within {limit} s")
            return Outcome(
                "error",
                type(exc).__qualname__,
                str(exc),
                "".join(traceback.format_exception(exc)),
            )
        return OK

    def shutdown(self, wait: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)
