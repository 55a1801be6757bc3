"""The supervisor's side of recycling: a pipe from each child, and the children retiring.

Each child gets the write end of its own pipe (its fd number in ``$TIMERS_RECYCLE_FD``,
see :mod:`timers.listener.recycling`) and writes one line per message; the supervisor waits
on the read ends instead of sleeping, so it hears a child at its limit at once. A pipe
names its child without doubt, unlike a signal, and closes by itself when the child exits.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from timers.listener.recycling import RECYCLE_FD_ENV


@dataclass
class Retiring:
    """A child that asked to be replaced: it claims until its slot's replacement claims
    (``told`` is False), then finishes its runs and exits 0."""

    slot: int
    child: subprocess.Popen[bytes]
    reason: str
    told: bool = False


class ChildLinks:
    """The read ends of the children's pipes, and the partial lines read from them."""

    def __init__(self) -> None:
        self._pipes: dict[int, tuple[subprocess.Popen[bytes], bytearray]] = {}

    def spawn(self, command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start a child with the write end of a new pipe."""
        read_end, write_end = os.pipe()
        try:
            child = subprocess.Popen(list(command), env={**env, RECYCLE_FD_ENV: str(write_end)},
                                     pass_fds=(write_end,))
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
