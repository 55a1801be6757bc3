"""Looking at processes through /proc, for tests of supervisors and signals."""

from __future__ import annotations

import os
from pathlib import Path


def children_of(pid: int, zombies: bool = False) -> set[int]:
    """Pids whose parent is ``pid`` (from /proc); zombies only if asked for."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if int(ppid) == pid and (zombies or state != "Z"):
            found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
