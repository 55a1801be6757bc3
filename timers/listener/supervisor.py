"""``timers listen --processes N``: N listener processes, restarted when one dies.

Signal handlers only set flags; the loop does the work. SIGTERM, SIGINT or SIGHUP is
passed to every child as SIGTERM (each then stops gracefully and hands back unfinished
timers) and the supervisor waits for them; a second signal is passed on too (a second
after the first at the earliest: a child takes a signal sooner than that as the same
stop), and the children exit at once. A child that keeps dying exhausts the restart budget: the
supervisor logs the last exit reasons, stops the others and exits 1.

With ``--max-runs-per-child`` or ``--max-memory-per-child`` a child at its limit asks
for a replacement over its pipe (:mod:`timers.listener.supervisor_recycling`): a standby
child takes its slot at once (or a new one starts), the old child stops claiming once the
replacement claims and finishes its runs. Its exit 0 is no crash: no restart, nothing taken
from the budget.

Should the supervisor itself die, even by ``kill -9``, its children stop gracefully too:
each knows its pid (``$TIMERS_SUPERVISOR_PID``, see :mod:`timers.listener.orphans`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from timers.clock import Clock, SystemClock
from timers.listener.orphans import SAME_STOP_WINDOW, SUPERVISOR_ENV
from timers.listener.supervisor_recycling import (
    ChildLinks,
    Retiring,
    SupervisorRecycling,
    exit_reason,
)

log = logging.getLogger("timers.listener.supervisor")
POLL = 0.2


@dataclass
class RestartBudget:
    """At most ``max_restarts`` restarts in any ``window`` seconds."""

    max_restarts: int = 10
    window: float = 60.0
    _times: deque[float] = field(default_factory=deque)

    def allow(self, now: float) -> bool:
        while self._times and now - self._times[0] > self.window:
            self._times.popleft()
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True


@dataclass(frozen=True)
class ListenOptions:
    """What each supervised ``timers listen`` child is started with; ``None`` leaves the
    listener's own default."""

    url: str | None = None
    tasks: str | None = None
    prefix: str | None = None
    concurrency: int | None = None
    lease: float | None = None
    shutdown_timeout: float = 30.0
    log_level: str | None = None
    burst: bool = False
    allow_eviction: bool = False
    log_format: str | None = None
    log_fires: bool = False
    max_runs_per_child: int | None = None
    max_memory_per_child: float | None = None
    groups: tuple[str, ...] = ()
    """The groups each child serves (none: its default)."""
    metrics_port: int | None = None
    """Children record Prometheus metrics; the supervisor serves them on this port."""
    metrics_host: str = "127.0.0.1"

    @property
    def recycles(self) -> bool:
        """Children are replaced at a limit (then even one process runs supervised)."""
        return self.max_runs_per_child is not None or self.max_memory_per_child is not None

    def child_command(self) -> list[str]:
        """The argv of one child: ``python -m timers listen`` with these options."""
        command = [sys.executable, "-m", "timers", "listen",
                   "--shutdown-timeout", repr(self.shutdown_timeout)]
        for flag, value in (("--url", self.url), ("--tasks", self.tasks),
                            ("--prefix", self.prefix), ("--concurrency", self.concurrency),
                            ("--lease", self.lease), ("--log-level", self.log_level),
                            ("--log-format", self.log_format),
                            ("--max-runs-per-child", self.max_runs_per_child),
                            ("--max-memory-per-child", self.max_memory_per_child)):
            if value is not None:
                command += [flag, str(value)]
        for group in self.groups:
            command += ["--group", group]
        if self.metrics_port is not None:
            command += ["--metrics-port", str(self.metrics_port)]
        command += ["--burst"] if self.burst else []
        command += ["--allow-eviction"] if self.allow_eviction else []
        command += ["--log-fires"] if self.log_fires else []
        return command


class Supervisor(SupervisorRecycling):
    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        shutdown_timeout: float = 30.0,
        budget: RestartBudget | None = None,
        clock: Clock | None = None,
        restart_clean_exits: bool = True,
        standby: bool = False,
    ) -> None:
        """``restart_clean_exits=False`` (for ``--burst``): a child that exits 0 is done,
        and the supervisor returns 0 once every child is. ``standby`` (with recycling):
        keep one more child started but not claiming, to take over from a recycled one
        at once."""
        self.command = list(command)
        self.processes = processes
        self.shutdown_timeout = shutdown_timeout
        self.budget = budget or RestartBudget()
        self.clock = clock or SystemClock()
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.signals_received = 0
        self.restart_clean_exits = restart_clean_exits
        self.last_exits: deque[str] = deque(maxlen=10)
        self.retiring: dict[int, Retiring] = {}
        """Recycled children by pid: replaced in their slot, finishing their runs."""
        self.links = ChildLinks()
        self.use_standby = standby
        self.standby: subprocess.Popen[bytes] | None = None
        self.child_exited: Callable[[int], None] = lambda pid: None
        """Told each child's pid as it is found dead (its metrics are dropped)."""
        self.standby_ready = False

    @classmethod
    def for_listeners(cls, options: ListenOptions, processes: int) -> Supervisor:
        """``processes`` listeners started with ``options``; with ``burst`` a child that
        exits 0 is done rather than restarted."""
        return cls(options.child_command(), processes, shutdown_timeout=options.shutdown_timeout,
                   restart_clean_exits=not options.burst,
                   standby=options.recycles and not options.burst)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals_received += 1

    def _spawn(self, slot: int, *, quiet: bool = False) -> subprocess.Popen[bytes]:
        env = dict(os.environ, **{SUPERVISOR_ENV: str(os.getpid())})
        child = self.children[slot] = self.links.spawn(self.command, env)
        if not quiet:
            log.info("listener %d started (pid %d)", slot, child.pid)
        return child

    def run(self) -> int:
        """Supervise until a signal (exit 0) or the restart budget runs out (exit 1)."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        for slot in range(self.processes):
            self._spawn(slot)
        if self.use_standby:
            self._spawn_standby()
        try:
            while not self.signals_received:
                if not self.children and not self.retiring:
                    return 0
                for child, message in self.links.wait(POLL):
                    self._on_message(child, message)
                if not (self._reap_retiring() and self._restart_dead()
                        and self._check_standby()):
                    self._shutdown()
                    return 1
            self._shutdown()
            return 0
        finally:
            self.links.close()

    def _restart_dead(self) -> bool:
        """Restart children that died; False once the restart budget is spent."""
        for slot, child in list(self.children.items()):
            code = child.poll()
            if code is None:
                continue
            self.links.forget(child)
            self.child_exited(child.pid)
            if code == 0 and not self.restart_clean_exits:
                del self.children[slot]
                continue
            reason = f"pid {child.pid} {exit_reason(code)}"
            if not self._count_crash(reason):
                del self.children[slot]
                return False
            log.warning("listener %d %s; restarting", slot, reason)
            self._spawn(slot)
        return True

    def _count_crash(self, reason: str) -> bool:
        """Record a crash against the budget; False (and the last exits logged) once the
        budget is spent."""
        self.last_exits.append(reason)
        if self.budget.allow(self.clock.monotonic()):
            return True
        log.critical("giving up: more than %d restarts in %gs; last exits: %s",
                     self.budget.max_restarts, self.budget.window, "; ".join(self.last_exits))
        return False

    def _shutdown(self) -> None:
        """Pass the signal on, wait for graceful exits, kill what is left after that."""
        children = [*self.children.values(), *(old.child for old in self.retiring.values()),
                    *([self.standby] if self.standby is not None else [])]
        forwarded, last = 0, 0.0
        deadline = self.clock.monotonic() + self.shutdown_timeout + 10
        while self.clock.monotonic() < deadline:
            # a child takes a signal within SAME_STOP_WINDOW of its first as the same stop:
            # an escalation waits until that has passed
            if forwarded < max(self.signals_received, 1) and (
                    not forwarded or self.clock.monotonic() - last >= SAME_STOP_WINDOW):
                forwarded, last = forwarded + 1, self.clock.monotonic()
                for child in children:
                    if child.poll() is None:
                        child.send_signal(signal.SIGTERM)
            if all(child.poll() is not None for child in children):
                break
            time.sleep(POLL)
        for child in children:
            if child.poll() is None:
                log.error("listener pid %d did not stop; killing it", child.pid)
                child.kill()
                child.wait()
