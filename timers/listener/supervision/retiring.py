"""The supervisor's side of recycling: a pipe from each child, the children retiring, the
standby.

Each child gets the write end of its own pipe (its fd number in ``$TIMERS_RECYCLE_FD``,
see :mod:`timers.listener.supervision.recycling`) and writes one line per message; the
supervisor waits on the read ends instead of sleeping, so it hears a child at its limit at
once. A pipe names its child without doubt, unlike a signal, and closes by itself when the
child exits.

With recycling, one more child runs as the standby: started, tasks loaded, connected, not
claiming. When a child asks to be replaced, the standby (once it said it is ready) is sent
SIGUSR2 and takes the slot within milliseconds, and a new standby starts; without a ready
standby a new child starts in the slot, and the old one claims until it claims.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from timers.listener.supervision.orphans import SUPERVISOR_ENV
from timers.listener.supervision.recycling import (
    CLAIMING,
    HANDOVER_SIGNAL,
    RECYCLE,
    RECYCLE_FD_ENV,
    STANDBY,
    STANDBY_ENV,
    TAKE_OVER_SIGNAL,
)
from timers.model.clock import Clock

log = logging.getLogger("timers.listener.supervision.supervisor")


@dataclass
class Retiring:
    """A child that asked to be replaced: it claims until its slot's replacement claims
    (``told`` is False), then finishes its runs and exits 0."""

    slot: int
    child: subprocess.Popen[bytes]
    reason: str
    told: bool = False
    since: float = 0.0
    """When it was told to stop claiming (the clock's monotonic seconds)."""
    warned: bool = False


class ChildLinks:
    """The read ends of the children's pipes, and the partial lines read from them."""

    def __init__(self) -> None:
        self._pipes: dict[int, tuple[subprocess.Popen[bytes], bytearray]] = {}

    def spawn(self, command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start a child with the write end of a new pipe."""
        read_end, write_end = os.pipe()
        try:
            # Its own process group: Ctrl-C in a terminal signals the supervisor alone, which
            # passes it on once (a child signalled twice exits at once, handing runs back).
            child = subprocess.Popen(list(command), env={**env, RECYCLE_FD_ENV: str(write_end)},
                                     pass_fds=(write_end,), process_group=0)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        os.set_blocking(read_end, False)
        self._pipes[read_end] = (child, bytearray())
        return child

    def wait(self, timeout: float) -> list[tuple[subprocess.Popen[bytes], str]]:
        """Up to ``timeout`` seconds for messages: ``(child, line)`` for each line read."""
        try:
            readable, _, _ = select.select(list(self._pipes), [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for safety
            return []
        messages = []
        for fd in readable:
            child, pending = self._pipes[fd]
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not data:  # the child exited (or closed it): nothing more will come
                self._drop(fd)
                continue
            pending += data
            *lines, rest = pending.split(b"\n")
            pending[:] = rest
            messages += [(child, line.decode(errors="replace").strip()) for line in lines]
        return messages

    def forget(self, child: subprocess.Popen[bytes]) -> None:
        """Close the pipe of an exited child (a grandchild may still hold it open)."""
        for fd, (owner, _) in list(self._pipes.items()):
            if owner is child:
                self._drop(fd)

    def _drop(self, fd: int) -> None:
        self._pipes.pop(fd, None)
        with contextlib.suppress(OSError):
            os.close(fd)

    def close(self) -> None:
        for fd in list(self._pipes):
            self._drop(fd)


def exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class SupervisorRecycling:
    """The supervisor's recycling: messages from children, retiring children, the
    standby. Mixed into :class:`timers.listener.supervision.supervisor.Supervisor`."""

    command: list[str]
    children: dict[int, subprocess.Popen[bytes]]
    retiring: dict[int, Retiring]
    links: ChildLinks
    standby: subprocess.Popen[bytes] | None
    standby_ready: bool
    clock: Clock
    shutdown_timeout: float

    def _spawn(self, slot: int, *, quiet: bool = False) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _count_crash(self, reason: str) -> bool:
        raise NotImplementedError

    def _on_message(self, child: subprocess.Popen[bytes], message: str) -> None:
        kind, _, detail = message.partition(" ")
        if child is self.standby:
            if kind == STANDBY and not self.standby_ready:
                self.standby_ready = True
                log.debug("standby listener (pid %d) is ready", child.pid)
            return
        slot = next((s for s, c in self.children.items() if c is child), None)
        if slot is None:
            return  # a retiring child: its slot has a replacement already
        if kind == RECYCLE:
            del self.children[slot]
            self.retiring[child.pid] = Retiring(slot, child, detail)
            taken = self._take_standby(slot)
            replacement = taken or self._spawn(slot, quiet=True)
            log.info("listener %d (pid %d) recycling after %s; replacement pid %d %s",
                     slot, child.pid, detail, replacement.pid,
                     "(the standby) takes over" if taken else "started")
            if taken:
                self._spawn_standby()
        elif kind == CLAIMING:
            for old in self.retiring.values():
                if old.slot == slot and not old.told and old.child.poll() is None:
                    old.told, old.since = True, self.clock.monotonic()
                    old.child.send_signal(HANDOVER_SIGNAL)
                    log.info("listener %d (pid %d) is claiming; pid %d stops claiming and "
                             "finishes its runs", slot, child.pid, old.child.pid)

    def _spawn_standby(self) -> None:
        env = dict(os.environ, **{SUPERVISOR_ENV: str(os.getpid()), STANDBY_ENV: "1"})
        self.standby, self.standby_ready = self.links.spawn(self.command, env), False
        log.info("standby listener started (pid %d): it claims once one is recycled",
                 self.standby.pid)

    def _take_standby(self, slot: int) -> subprocess.Popen[bytes] | None:
        """The standby, told to claim in ``slot``, if it is ready."""
        standby = self.standby
        if standby is None or not self.standby_ready or standby.poll() is not None:
            return None
        standby.send_signal(TAKE_OVER_SIGNAL)
        self.children[slot], self.standby = standby, None
        return standby

    def _check_standby(self) -> bool:
        """A standby that exited crashed (it never exits by itself): count it, start
        another; False once the restart budget is spent."""
        if self.standby is None or (code := self.standby.poll()) is None:
            return True
        self.links.forget(self.standby)
        reason = f"pid {self.standby.pid} {exit_reason(code)}"
        self.standby = None
        if not self._count_crash(reason):
            return False
        log.warning("standby listener %s; restarting", reason)
        self._spawn_standby()
        return True

    def _reap_retiring(self) -> bool:
        """Forget recycled children that exited; one that did not exit 0 crashed, and
        counts against the budget (False once it is spent). None is restarted: each has
        its replacement already."""
        for pid, old in list(self.retiring.items()):
            code = old.child.poll()
            if code is None:
                self._warn_if_stuck(old)
                continue
            del self.retiring[pid]
            self.links.forget(old.child)
            if code == 0:
                log.info("listener %d (pid %d) recycled: its runs finished", old.slot, pid)
                continue
            reason = f"pid {pid} {exit_reason(code)}"
            if not self._count_crash(reason):
                return False
            log.warning("listener %d (recycling) %s; its replacement runs", old.slot, reason)
        return True

    def _warn_if_stuck(self, old: Retiring) -> None:
        """Once, when a recycled child drains for longer than the shutdown timeout: a task
        that never returns keeps it (and its timer) forever, beside its replacement."""
        if not old.told or old.warned:
            return
        waited = self.clock.monotonic() - old.since
        if waited > self.shutdown_timeout:
            old.warned = True
            log.warning("listener %d (pid %d) still finishing its runs %.0f s after it was "
                        "replaced: a task that does not return keeps it (give the task a "
                        "timeout=; a stop signal hands its runs back after "
                        "--shutdown-timeout)", old.slot, old.child.pid, waited)
