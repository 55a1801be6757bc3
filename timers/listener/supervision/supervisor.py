"""``timers listen --processes N``: N listener processes, restarted when one dies.

Signal handlers only set flags; the loop does the work. SIGTERM, SIGINT or SIGHUP is
passed to every child as SIGTERM (each then stops gracefully and hands back unfinished
timers) and the supervisor waits for them; a second signal is passed on too (a second
after the first at the earliest: a child takes a signal sooner than that as the same
stop), and the children exit at once. A child that keeps dying exhausts the restart budget: the
supervisor logs the last exit reasons, stops the others and exits 1.

With ``--max-runs-per-child`` or ``--max-memory-per-child`` a child at its limit asks
for a replacement over its pipe (:mod:`timers.listener.supervision.retiring`): a standby
child takes its slot at once (or a new one starts), the old child stops claiming once the
replacement claims and finishes its runs. Its exit 0 is no crash: no restart, nothing taken
from the budget.

Should the supervisor itself die, even by ``kill -9``, its children exit within seconds
too (their running tasks get 2 s, the rest is handed back): each knows its pid
(``$TIMERS_SUPERVISOR_PID``, see :mod:`timers.listener.supervision.orphans`).

As a container's PID 1 (or a child subreaper, ``PR_SET_CHILD_SUBREAPER``) every process
orphaned inside it is re-parented to the supervisor: a task's subprocess whose listener
crashed, say. On SIGCHLD (the handler sets a flag) the loop reaps each such process, so
none stays a zombie; its own children it reaps as before, through their ``Popen``.
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

from timers.listener.defaults import WAIT_FOR_REDIS
from timers.listener.supervision.orphans import SAME_STOP_WINDOW, SUPERVISOR_ENV
from timers.listener.supervision.retiring import (
    ChildLinks,
    Retiring,
    SupervisorRecycling,
    exit_reason,
)
from timers.model.clock import Clock, SystemClock

log = logging.getLogger("timers.listener.supervision.supervisor")
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
    wait_for_redis: float = WAIT_FOR_REDIS
    """Seconds to wait at start for a server that does not answer (children wait
    without limit: their supervisor reached it already)."""
    history_age: str | None = None
    """``--history-age`` as given (a duration)."""
    history_count: int | None = None
    series: bool = True
    replicas: int | None = None
    """Replicas each claim must reach before its runs start (``--replicas``)."""
    replicas_timeout: float | None = None

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
                            ("--max-memory-per-child", self.max_memory_per_child),
                            ("--history-age", self.history_age),
                            ("--history-count", self.history_count),
                            ("--replicas", self.replicas),
                            ("--replicas-timeout", self.replicas_timeout)):
            if value is not None:
                command += [flag, str(value)]
        for group in self.groups:
            command += ["--group", group]
        if self.metrics_port is not None:
            command += ["--metrics-port", str(self.metrics_port)]
        command += ["--burst"] if self.burst else []
        command += ["--allow-eviction"] if self.allow_eviction else []
        command += ["--log-fires"] if self.log_fires else []
        command += [] if self.series else ["--no-series"]
        return command


PR_GET_CHILD_SUBREAPER = 37


def adopts_orphans() -> bool:
    """This process is PID 1 of its pid namespace, or a child subreaper: orphaned
    descendants are re-parented to it, and it must reap them."""
    if os.getpid() == 1:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        return bool(libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
                    and flag.value)
    except (OSError, AttributeError):
        return False


class OrphanReaper:
    """Reaps the processes re-parented to this one, leaving its own children (those in
    ``own``) to their ``Popen``, whose exit codes the supervisor reads."""

    def __init__(self, own: Callable[[], list[subprocess.Popen[bytes]]]) -> None:
        self._own = own
        self.enabled = False
        """Only a process that adopts orphans (:func:`adopts_orphans`) reaps them: any
        other may have children that are not its to reap."""
        self.pending = True
        """A SIGCHLD came since the last reap (set by the signal handler)."""
        self.reaped = 0

    def on_sigchld(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True

    def reap(self) -> None:
        """Reap every exited process that is not one of ours; ours are polled (which
        reaps them and keeps their exit code)."""
        if not (self.enabled and self.pending):
            return
        self.pending = False
        seen: set[int] = set()
        while True:
            try:  # WNOWAIT: look first, so an own child is reaped by its Popen
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in seen:
                return
            seen.add(info.si_pid)
            own = next((c for c in self._own() if c.pid == info.si_pid), None)
            if own is not None:
                own.poll()
                continue
            try:
                os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                continue
            self.reaped += 1
            log.debug("reaped pid %d, a process orphaned by a child (status %d)",
                      info.si_pid, info.si_status)


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
        self.reaper = OrphanReaper(self._own_children)

    def _own_children(self) -> list[subprocess.Popen[bytes]]:
        return [*self.children.values(), *(old.child for old in self.retiring.values()),
                *([self.standby] if self.standby is not None else [])]

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
        self.reaper.enabled = adopts_orphans()
        if self.reaper.enabled:
            signal.signal(signal.SIGCHLD, self.reaper.on_sigchld)
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
                self.reaper.reap()
                if not (self._reap_retiring() and self._restart_dead()
                        and self._check_standby()):
                    self._shutdown()
                    return 1
            self._shutdown()
            return 0
        finally:
            self.links.close()
            if self.reaper.enabled:
                self.reaper.pending = True
                self.reaper.reap()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)

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
        children = self._own_children()
        forwarded, last = 0, 0.0
        deadline = self.clock.monotonic() + self.shutdown_timeout + 10
        while self.clock.monotonic() < deadline:
            # a child takes a signal within SAME_STOP_WINDOW of its first as the same stop:
            # an escalation waits until that has passed, by the child's clock too (a loaded
            # child may handle the first signal late: twice the window)
            if forwarded < max(self.signals_received, 1) and (
                    not forwarded or self.clock.monotonic() - last >= 2 * SAME_STOP_WINDOW):
                forwarded, last = forwarded + 1, self.clock.monotonic()
                for child in children:
                    if child.poll() is None:
                        child.send_signal(signal.SIGTERM)
            if all(child.poll() is not None for child in children):
                break
            time.sleep(POLL)
            self.reaper.reap()
        for child in children:
            if child.poll() is None:
                log.error("listener pid %d did not stop; killing it", child.pid)
                child.kill()
                child.wait()
