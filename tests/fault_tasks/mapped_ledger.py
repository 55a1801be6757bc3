"""``mapped_ledger.work`` and ``mapped_ledger.die``: a ledger of starts and ends that a
process's death cannot cut between a task's end mark and its return.

Each process writes its lines into a memory-mapped file of its own in the directory named
by ``$TIMERS_MAPPED_LEDGER`` (``<pid>.ledger``): a store to memory, done holding the GIL,
so no other thread (a poison calling ``os._exit``) runs between the end mark and the
task's return, as one could while an ``os.write`` of the mark let the GIL go. What the
listener does after the return is then what a test of crashes measures. The kernel keeps
the pages of a shared mapping whatever becomes of the process::

    S <timer id> <pid> <monotonic s>      as the run starts
    E <timer id> <pid> <monotonic s>      as it returns
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections import Counter
from pathlib import Path

MAPPED_LEDGER_ENV = "TIMERS_MAPPED_LEDGER"
SIZE = 1 << 20

_lock = threading.Lock()
_state: dict[str, object] = {}


def _mark(kind: str, tid: str) -> None:
    line = f"{kind} {tid} {os.getpid()} {time.monotonic():.4f}\n".encode()
    with _lock:
        if _state.get("pid") != os.getpid():  # first mark in this process (or a fork)
            path = Path(os.environ[MAPPED_LEDGER_ENV]) / f"{os.getpid()}.ledger"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, SIZE)
            _state.update(pid=os.getpid(), map=mmap.mmap(fd, SIZE), at=0)
            os.close(fd)
        at = _state["at"]
        assert isinstance(at, int)
        mapped = _state["map"]
        assert isinstance(mapped, mmap.mmap)
        mapped[at:at + len(line)] = line
        _state["at"] = at + len(line)


def work(tid: str, seconds: float = 0.02) -> None:
    """Mark the start, work ``seconds`` (a call to another service), mark the end."""
    _mark("S", tid)
    time.sleep(seconds)
    _mark("E", tid)


def die(tid: str) -> None:
    """Mark the start, then end the whole process at once, as a crashing C extension."""
    _mark("S", tid)
    os._exit(3)


def read(directory: Path) -> tuple[Counter[str], Counter[str], dict[str, list[float]]]:
    """(starts, ends) per timer id, over every process's ledger in ``directory``, and the
    times each timer started at (monotonic, this host's clock), in order."""
    starts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    started: dict[str, list[float]] = {}
    for path in directory.glob("*.ledger"):
        for line in path.read_bytes().split(b"\0", 1)[0].decode().splitlines():
            kind, tid, _, at = line.split(" ")
            (starts if kind == "S" else ends)[tid] += 1
            if kind == "S":
                started.setdefault(tid, []).append(float(at))
    return starts, ends, {tid: sorted(times) for tid, times in started.items()}
