"""The rule of ``tests/unit``: a unit test starts no process and no server.

:func:`forbid` (applied to every unit test by hooks in ``tests/unit/conftest.py``, so a new
file is covered without doing anything) makes each way of starting a process, and
``listen()`` on any socket, record the attempt and raise :class:`Forbidden`. A test whose
code caught that exception still fails: the hooks fail it on the attempts recorded. Any
child the process has after a phase that it did not have before (a start through some path
not patched: a C extension, ``ctypes``) fails it too, found through ``/proc``.

A test that needs a process or a server belongs in ``tests/integration``.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

# (module, attribute, what it starts): every way the standard library starts a process.
# subprocess.Popen (so asyncio's subprocesses, os.popen) goes through subprocess._fork_exec
# or os.posix_spawn; multiprocessing's spawn and forkserver through
# _posixsubprocess.fork_exec, its fork context through os.fork; pty.fork through os.forkpty.
# A fork server already running (an integration test's, in the same xdist worker) forks a
# new child on request: that request is guarded too (the child is not ours to see in /proc).
GUARDED: list[tuple[Any, str, str]] = [
    (forkserver, "connect_to_new_process", "a process (through a fork server)"),
    (subprocess, "_fork_exec", "a subprocess"),
    (_posixsubprocess, "fork_exec", "a process (fork_exec)"),
    (os, "fork", "a process (fork)"),
    (os, "forkpty", "a process (forkpty)"),
    (os, "posix_spawn", "a process (posix_spawn)"),
    (os, "posix_spawnp", "a process (posix_spawnp)"),
    (os, "system", "a process (os.system)"),
    (socket.socket, "listen", "a server (a socket listening)"),
]


class Forbidden(AssertionError):
    """A unit test tried to start a process or a server."""


def children() -> set[int]:
    """This process's children, zombies included (``/proc/self/task/*/children``)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:  # a thread that ended meanwhile
            continue
    return found


def _blocked(what: str, attempts: list[str]) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        where = "".join(traceback.format_stack(limit=8)[:-1])
        attempts.append(f"started {what}:\n{where}")
        raise Forbidden(f"a unit test starts no {what.removeprefix('a ')}: "
                        "move it to tests/integration, or test the logic without one")
    return refuse


@contextmanager
def forbid() -> Iterator[list[str]]:
    """Within the block, starting a process or listening on a socket raises
    :class:`Forbidden`; yields the list of attempts (each with the stack that made it)."""
    attempts: list[str] = []
    guarded = [(owner, name, what) for owner, name, what in GUARDED if hasattr(owner, name)]
    # an attribute the owner only inherits (socket.socket.listen) is deleted afterwards
    saved = [(owner, name, vars(owner).get(name)) for owner, name, _ in guarded]
    for owner, name, what in guarded:
        setattr(owner, name, _blocked(what, attempts))
    try:
        yield attempts
    finally:
        for owner, name, original in saved:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def violations(attempts: list[str], before: set[int]) -> str | None:
    """What to fail a test with: its attempts, or children it left that were not there
    ``before``; None if it kept to the rule."""
    new = children() - before
    if not attempts and not new:
        return None
    lines = ["a unit test starts no process and no server (tests/unit/no_processes.py); "
             "move it to tests/integration or test the logic without one"]
    lines += attempts
    if new:
        lines.append(f"child processes appeared: {sorted(new)}")
    return "\n".join(lines)
