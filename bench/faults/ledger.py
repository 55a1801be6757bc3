"""What the ledger says: which timers ran, how often, how late, and which second runs a
fault explains.

Every run of a fault task appends ``S id pid time`` as it starts and ``E id pid time`` when it
returns to a ledger file (``O_APPEND``; Redis faults cannot touch it). From the ledger:

- **fired**: timers with a completed run; **lost**: timers without one.
- **duplicate runs**: starts beyond the first. One is *expected* only when the run before it
  was cut short by a :class:`Signal` (a signal the bench sent, or a process death it
  caused): it started in that process before the signal and did not end before its
  ``cutoff``. Any other duplicate is a failure.
- **lateness**: first start minus due time (both on this machine's clock).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KILL_FLUSH_GRACE = 0.5
"""Seconds before a SIGKILL in which a finished run may not have been written yet."""


@dataclass(frozen=True)
class Signal:
    """A signal the bench sent to a process (or a death it caused there).

    A run of that process that started before ``at`` and did not end before ``cutoff``
    was cut short by it, so a second run of its timer is expected. ``sent``, where the
    death came some time after what the bench did (a child dying with its supervisor),
    is when the bench did it: reruns are timed from then.
    """

    pid: int
    name: str
    at: float
    cutoff: float
    sent: float | None = None


@dataclass(frozen=True)
class Mark:
    """One ledger line: ``S`` (a run started) or ``E`` (it returned)."""

    kind: str
    tid: str
    pid: int
    at: float


def read_ledger(path: Path) -> list[Mark]:
    """Every complete line of the ledger, in the order they were written."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    marks = []
    for line in data.decode(errors="replace").splitlines(keepends=True):
        parts = line.split()
        if not line.endswith("\n") or len(parts) != 4:
            continue  # a line being written
        marks.append(Mark(parts[0], parts[1], int(parts[2]), float(parts[3])))
    return marks


@dataclass
class RunRecord:
    """One run of a timer: where it ran, when it started and (if it did) ended."""

    tid: str
    pid: int
    start: float
    end: float | None = None


def runs_by_timer(marks: Iterable[Mark]) -> dict[str, list[RunRecord]]:
    """The runs of each timer in start order, each start paired with its end line."""
    runs: dict[str, list[RunRecord]] = defaultdict(list)
    open_runs: dict[tuple[str, int], list[RunRecord]] = defaultdict(list)
    for mark in marks:
        if mark.kind == "S":
            record = RunRecord(mark.tid, mark.pid, mark.at)
            runs[mark.tid].append(record)
            open_runs[mark.tid, mark.pid].append(record)
        elif mark.kind == "E" and open_runs[mark.tid, mark.pid]:
            open_runs[mark.tid, mark.pid].pop(0).end = mark.at
    for records in runs.values():
        records.sort(key=lambda run: run.start)
    return dict(runs)


def open_runs(path: Path, pid: int) -> list[str]:
    """Timers whose task is running in process ``pid`` now: started, not yet returned."""
    marks = [m for m in read_ledger(path) if m.pid == pid]
    return [run.tid for runs in runs_by_timer(marks).values() for run in runs
            if run.end is None]


def starts(path: Path, tid: str) -> list[Mark]:
    """The start lines of timer ``tid``."""
    return [m for m in read_ledger(path) if m.kind == "S" and m.tid == tid]


def completed(path: Path, tids: Iterable[str]) -> bool:
    """Whether every timer in ``tids`` has a run that returned."""
    done = {m.tid for m in read_ledger(path) if m.kind == "E"}
    return all(tid in done for tid in tids)


@dataclass
class Verdict:
    """What the ledger says about one batch of timers."""

    timers: int
    fired: int
    lost: list[str]
    expected_duplicates: int
    unexpected_duplicates: list[str]
    lateness_ms: list[float]
    rerun_after_signal_ms: list[float]
    most_runs: int = 0
    """The most starts of any one timer."""

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unexpected_duplicates


def _cut_short(run: RunRecord, signals: Sequence[Signal]) -> Signal | None:
    for sig in signals:
        if sig.pid == run.pid and run.start <= sig.at and (
                run.end is None or run.end >= sig.cutoff):
            return sig
    return None


def analyse(due_ms: Mapping[str, int], marks: Iterable[Mark],
            signals: Sequence[Signal] = ()) -> Verdict:
    """Judge the timers ``due_ms`` (id → due, epoch ms) by their ledger ``marks``."""
    runs = runs_by_timer(marks)
    lost: list[str] = []
    unexpected: list[str] = []
    expected = 0
    lateness: list[float] = []
    rerun_after: list[float] = []
    fired = most = 0
    for tid, due in due_ms.items():
        mine = runs.get(tid, [])
        most = max(most, len(mine))
        if any(run.end is not None for run in mine):
            fired += 1
        else:
            lost.append(tid)
        if mine:
            lateness.append(mine[0].start * 1000 - due)
        for previous, run in itertools.pairwise(mine):
            cause = _cut_short(previous, signals)
            if cause is None:
                unexpected.append(tid)
            else:
                expected += 1
                rerun_after.append((run.start - (cause.sent or cause.at)) * 1000)
    return Verdict(len(due_ms), fired, lost, expected, unexpected, lateness, rerun_after,
                   most)
