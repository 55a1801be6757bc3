"""What every scenario shares: sizes, the server, listener processes, deadlines, figures."""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PREFIX = "bench"
NOOP = "noop"
"""The trivial task every listener child registers (``registry={"noop": noop}``)."""
BACKGROUND_TASK = "background.pending"
"""Task of the timers that only sit in the index, due an hour out; never fires in a run."""
HOUR = 3600.0
LOAD_CHUNK = 100_000
"""Timers per ``schedule_many`` call when bulk-loading (bounds the client's memory)."""


def args_100(i: int) -> dict[str, Any]:
    """Keyword args that are exactly 100 bytes as compact JSON, different for each ``i``."""
    return {"user_id": i, "text": "x" * (88 - len(str(i)))}


# -- sizes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; :meth:`quick` shrinks everything to about a minute."""

    quick: bool = False
    spread_n: int = 2_000
    spread_s: float = 10.0
    steady_rate: int = 1_000
    steady_s: float = 30.0
    background_n: int = 1_000_000
    sync_s: float = 5.0
    async_s: float = 5.0
    async_in_flight: int = 100
    many_n: int = 200_000
    fire_ns: tuple[int, ...] = (20_000, 100_000)
    memory_ns: tuple[int, ...] = (100_000, 1_000_000)
    idle_n: int = 1_000_000
    idle_s: float = 30.0
    scale_n: int = 10_000_000

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def quick_run(cls) -> Sizes:
        return cls(
            quick=True, spread_n=1_000, spread_s=3.0, steady_s=4.0, background_n=100_000,
            sync_s=1.0, async_s=1.0, many_n=50_000, fire_ns=(20_000,),
            memory_ns=(100_000,), idle_n=100_000, idle_s=10.0, scale_n=200_000,
        )


# -- results ----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table."""

    scenario: str
    figure: str
    result: str
    target: str = ""
    met: bool | None = None
    peer: str = ""
    others: str = ""
    """CPU other processes on the machine used while this was measured (% of one core)."""


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    load_probe: Callable[[], str] | None = None
    """Fills :attr:`Row.others` (set by :class:`Context`)."""

    def add(self, row: Row) -> Row:
        if not row.others and self.load_probe is not None:
            with contextlib.suppress(Exception):
                row.others = self.load_probe()
        self.rows.append(row)
        print(f"  {row.scenario} | {row.figure}: {row.result}"
              + (f"   [target {row.target}: {_met_text(row.met)}]" if row.target else ""),
              flush=True)
        return row

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)


def _met_text(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "-"}[met]


def render(settings: Sequence[tuple[str, str]], results: Results) -> str:
    """The settings, the table and the notes, as Markdown (also what is printed)."""
    lines = ["Settings:", ""]
    lines += [f"- {name}: {value}" for name, value in settings]
    header = ("Scenario", "Figure", "Result", "Target", "Met", "Best peer measured",
              "Others' CPU")
    table = [header] + [
        (r.scenario, r.figure, r.result, r.target or "-", _met_text(r.met) if r.target else "-",
         r.peer or "-", r.others or "-")
        for r in results.rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    lines += ["", line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [line(row) for row in table[1:]]
    if results.notes:
        lines += ["", "Notes from this run:", ""]
        lines += [f"- {n}" for n in results.notes]
    return "\n".join(lines) + "\n"


# -- figures ----------------------------------------------------------------------------


def due_at(due_ms: int) -> datetime:
    return datetime.fromtimestamp(due_ms / 1000, tz=UTC)


def ms(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def count(value: float) -> str:
    return f"{value:,.0f}"


def shares(sources: Sequence[str]) -> str:
    """E.g. ``event 12%, sweep 88%`` for the paths timers fired by."""
    if not sources:
        return "n/a"
    counts = Counter(sources)
    return ", ".join(f"{name} {100 * counts[name] / len(sources):.0f}%"
                     for name in ("event", "sweep", "recovered") if counts[name])


# -- deadlines --------------------------------------------------------------------------


class ScenarioTimeout(Exception):
    """A scenario ran past its hard limit (its soft deadlines should have ended it)."""


@contextlib.contextmanager
def hard_limit(seconds: float, name: str) -> Iterator[None]:
    """Raise :class:`ScenarioTimeout` in the main thread after ``seconds``."""

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise ScenarioTimeout(f"{name} ran past its hard limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.end


def wait_until(predicate: Callable[[], bool], seconds: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true (True) or ``seconds`` pass (False)."""
    deadline = Deadline(seconds)
    while True:
        if predicate():
            return True
        if deadline.passed():
            return False
        time.sleep(min(interval, deadline.left()))
