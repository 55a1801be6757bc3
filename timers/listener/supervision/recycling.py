"""Recycling a supervised listener whose tasks leak: the child's side.

With ``--max-runs-per-child`` or ``--max-memory-per-child`` each child checks its limit
after every finished run (a counter, and its RSS read from ``/proc/self/statm``). At the
limit it asks the supervisor for a replacement at once, over a pipe the supervisor gave it
(its fd is in ``$TIMERS_RECYCLE_FD``), and keeps claiming until the replacement says it
claims: the fleet never has fewer claiming children than ``--processes``. Then the
supervisor sends it SIGUSR1: it stops claiming, finishes every run it holds (no shutdown
timeout, nothing handed back), writes their endings and exits 0.

The replacement is usually the supervisor's standby (``$TIMERS_STANDBY``): a child that
loaded its tasks and connected, said ``standby`` on its pipe, and waits for SIGUSR2 to
start claiming, so a handover takes milliseconds rather than a process start.

A SIGTERM while it drains is the ordinary graceful stop: the runs still going get the
shutdown timeout and the rest is handed back. Messages on the pipe are single lines,
``recycle <reason>``, ``claiming`` and ``standby``; a signal handler only sets a flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import stat
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from timers.exceptions import MemoryLimitTooLow
from timers.listener.retrying import RETRYABLE

log = logging.getLogger("timers.listener")

RECYCLE_FD_ENV = "TIMERS_RECYCLE_FD"
"""The write end of the pipe to the supervisor, inherited by each child."""
HANDOVER_SIGNAL = signal.SIGUSR1
"""Sent by the supervisor to a child at its limit once its replacement claims."""
TAKE_OVER_SIGNAL = signal.SIGUSR2
"""Sent by the supervisor to its standby: start claiming."""
STANDBY_ENV = "TIMERS_STANDBY"
"""Set for the standby child: load the tasks, connect, then wait for TAKE_OVER_SIGNAL."""
CLAIMING = "claiming"
RECYCLE = "recycle"
STANDBY = "standby"


def rss_bytes() -> int:
    """This process's resident memory now (peak resident memory where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


@dataclass(frozen=True)
class RecycleLimits:
    """When a child is replaced: after ``max_runs`` finished runs, or once its resident
    memory reaches ``max_memory_mb`` megabytes (``None``: no such limit)."""

    max_runs: int | None = None
    max_memory_mb: float | None = None

    def __post_init__(self) -> None:
        if self.max_runs is not None and self.max_runs < 1:
            raise ValueError("--max-runs-per-child must be at least 1")
        if self.max_memory_mb is not None and self.max_memory_mb <= 0:
            raise ValueError("--max-memory-per-child must be more than 0 MB")

    @property
    def enabled(self) -> bool:
        return self.max_runs is not None or self.max_memory_mb is not None

    def reached(self, runs: int, rss: Callable[[], int] = rss_bytes) -> str | None:
        """Why this child is at its limit after ``runs`` finished runs, or None."""
        if self.max_runs is not None and runs >= self.max_runs:
            return f"{runs} runs"
        if self.max_memory_mb is not None:
            megabytes = rss() / 1e6
            if megabytes >= self.max_memory_mb:
                return f"{megabytes:.0f} MB of memory (limit {self.max_memory_mb:g} MB)"
        return None


def check_memory_limit(limit_mb: float | None) -> None:
    """Raise :class:`MemoryLimitTooLow` if this process (tasks loaded) is at the limit."""
    megabytes = rss_bytes() / 1e6
    if limit_mb is not None and megabytes >= limit_mb:
        raise MemoryLimitTooLow(
            f"--max-memory-per-child {limit_mb:g} MB is below this listener's memory at "
            f"start ({megabytes:.0f} MB, tasks loaded): raise it")


def report_fd() -> int | None:
    """The pipe to the supervisor, if this process has one (a variable inherited without
    its pipe, by a task's subprocess, does not count)."""
    value = os.environ.get(RECYCLE_FD_ENV, "")
    if not value.isdigit():
        return None
    try:
        return int(value) if stat.S_ISFIFO(os.fstat(int(value)).st_mode) else None
    except OSError:
        return None


class Recycler:
    """One listener's part in recycling; the listener calls it at a few points.

    ``stop_claiming`` is called (on the loop) once the replacement claims, or at once
    when there is no supervisor to ask.
    """

    def __init__(self, limits: RecycleLimits | None, stop_claiming: Callable[[], None],
                 fd: int | None) -> None:
        self.limits = limits or RecycleLimits()
        self.fd = fd
        """The pipe to the supervisor (:func:`report_fd`); None: no supervisor."""
        self._stop_claiming = stop_claiming
        self.requested: str | None = None
        """Why this child asked to be replaced (None: it has not)."""
        self.draining = False
        """It stopped claiming to be replaced: finish every run, hand none back."""
        self.hurry = asyncio.Event()
        """A stop signal came while draining: the ordinary shutdown timeout applies."""
        self._announced = False
        self.standby = self.limits.enabled and fd is not None and bool(
            os.environ.get(STANDBY_ENV))
        """Started ahead as the next replacement: claims only once told to."""
        self._go = asyncio.Event()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen for the supervisor's go-ahead (only where there are limits). Raises
        :class:`MemoryLimitTooLow` if the memory limit is reached before any run."""
        check_memory_limit(self.limits.max_memory_mb)
        if self.limits.enabled and self.fd is not None:
            loop.add_signal_handler(HANDOVER_SIGNAL, self._handover)
            loop.add_signal_handler(TAKE_OVER_SIGNAL, self._go.set)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Ignore a late go-ahead from now on (its default action would kill us)."""
        if self.limits.enabled and self.fd is not None:
            for sig in (HANDOVER_SIGNAL, TAKE_OVER_SIGNAL):
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)

    async def wait_for_turn(self, stopping: asyncio.Event) -> None:
        """The standby: tell the supervisor it is ready (tasks loaded, connected), then
        wait until it is told to claim, or to stop."""
        if not self.standby:
            return
        self._send(STANDBY)
        go, stop = asyncio.create_task(self._go.wait()), asyncio.create_task(stopping.wait())
        await asyncio.wait([go, stop], return_when=asyncio.FIRST_COMPLETED)
        go.cancel()
        stop.cancel()
        if self._go.is_set():
            log.info("standby: taking over, claiming now")

    def after_run(self, runs: int) -> None:
        """Called after each finished run: ask for a replacement at the limit."""
        if self.requested is not None or not self.limits.enabled:
            return
        reason = self.limits.reached(runs)
        if reason is None:
            return
        self.requested = reason
        if self.fd is None:
            log.info("recycling after %s: finishing running tasks, then exiting", reason)
            self._handover()
            return
        log.info("recycling after %s: asked for a replacement; claiming until it claims",
                 reason)
        self._send(f"{RECYCLE} {reason}")

    def published(self) -> None:
        """Called after each heartbeat: the first one tells the supervisor this child
        claims (a recycled child's replacement, or any other)."""
        if not self._announced and self.fd is not None:
            self._announced = True
            self._send(CLAIMING)

    def state(self, stopping: bool) -> str:
        """``claiming`` or ``draining``, as the heartbeat shows it."""
        return "draining" if stopping else "claiming"

    def heartbeat_info(self, stopping: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"state": self.state(stopping)}
        if self.requested is not None:
            info["recycling"] = self.requested
        return info

    def _handover(self) -> None:
        if self.draining:
            return
        self.draining = True
        self._stop_claiming()

    async def wait_for_runs(self, running: list[asyncio.Task[None]],
                            publish: Callable[[], Awaitable[None]]) -> None:
        """Draining to be replaced: say so in the heartbeat (``publish``), then wait for
        every run, unless a stop signal comes."""
        if not self.draining:
            return
        with contextlib.suppress(*RETRYABLE):
            await publish()
        if self.hurry.is_set() or not running:
            return
        log.info("recycling: waiting for %d running task(s) to finish", len(running))
        hurry = asyncio.create_task(self.hurry.wait())
        everything: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
        await asyncio.wait([everything, hurry], return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()

    def _send(self, message: str) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # the supervisor is gone: orphans.py stops us
            os.write(self.fd, (message + "\n").encode())

