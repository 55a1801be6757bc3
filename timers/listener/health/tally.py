"""What a listener ran, for its log: one line per fired timer (when asked for), the ids
of the timers it hands back, and a summary when it stops.

A fire line (logger ``timers.fires``, INFO) carries structured fields for JSON logs:
``id``, ``task``, ``attempt``, ``source``, ``lateness_ms``, ``duration_ms`` and ``outcome``:
``ok``, ``skipped``, ``retry`` (failed, will run again), ``failed`` (failed for good: see
``timers failed``); a failed run also ``error`` (the exception type).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from timers.listener.endings.ending import Executed
from timers.listener.health.recent import RecentRuns
from timers.model.due import format_duration
from timers.model.runs import Fired
from timers.model.wire import EndingKind

log = logging.getLogger("timers.listener")
fires_log = logging.getLogger("timers.fires")

MAX_IDS = 20
"""Timer ids named in one "handing back" line; the rest are counted."""

_OUTCOMES = {EndingKind.OK: "ok", EndingKind.SKIP: "skipped", EndingKind.RETRY: "retry",
             EndingKind.FAIL: "failed", EndingKind.RELEASE: "handed back"}


def plain(text: object) -> str:
    """``text`` with control characters escaped, so one id stays on one log line."""
    value = str(text)
    return value if value.isprintable() else repr(value)[1:-1]


def some_ids(ids: list[str], limit: int = MAX_IDS) -> str:
    """``a, b, c`` for the first ``limit`` ids, then ``… and N more``."""
    shown = ", ".join(plain(i) for i in ids[:limit])
    return shown + (f" … and {len(ids) - limit} more" if len(ids) > limit else "")


class RunObserver(Protocol):
    """Hears what the tally counts (the listener's Prometheus metrics)."""

    def ended(self, done: Executed) -> None: ...
    def handed_back_runs(self, n: int) -> None: ...
    def rejected_key(self) -> None: ...


@dataclass
class RunTally:
    """Counts how runs ended; logs fires (``log_fires``), hand-backs and the summary;
    tells its ``observers``."""

    log_fires: bool = False
    counts: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    observers: list[RunObserver] = field(default_factory=list)
    recent: RecentRuns = field(default_factory=RecentRuns)
    """The last minute's runs, for the heartbeat."""

    def ended(self, done: Executed) -> None:
        """A run ended (or was handed back unrun: ``done.report`` is None)."""
        for observer in self.observers:
            observer.ended(done)
        if done.ending is None:
            self.counts["held back"] += 1
            return
        kind = done.ending.kind
        label = _OUTCOMES.get(kind) or str(kind)
        self.counts[label] += 1
        if done.report is not None:
            self.recent.started(done.report.lateness_ms, done.report.task or "")
        if self.log_fires and done.report is not None:
            log_fire(done.report, label)

    def held_back(self, count: int) -> None:
        """Claimed runs a concurrency key held back before they started."""
        for _ in range(count):
            self.ended(Executed(None, None))

    def hand_back(self, timer_ids: list[str]) -> None:
        """Unfinished runs go back to the due index at shutdown: say which."""
        self.counts["handed back"] += len(timer_ids)
        for observer in self.observers:
            observer.handed_back_runs(len(timer_ids))
        log.warning("handing back %d unfinished run(s) to run elsewhere: %s",
                    len(timer_ids), some_ids(timer_ids), extra={"ids": timer_ids[:MAX_IDS]})

    def rejected(self) -> None:
        """An expired key named no runnable timer (it is recorded for ``timers failed``)."""
        for observer in self.observers:
            observer.rejected_key()

    def summary(self) -> str:
        c = self.counts
        fired = c["ok"] + c["failed"] + c["retry"] + c["skipped"]
        return (f"{fired} run(s) fired: {c['ok']} ok, {c['failed']} failed, "
                f"{c['retry']} to retry, {c['skipped']} skipped; {c['handed back']} handed "
                f"back; up {format_duration(time.monotonic() - self.started)}")

    def log_stopped(self) -> None:
        """The listener's last line."""
        c = self.counts
        log.info("stopped: %s", self.summary(), extra={
            "fired": c["ok"] + c["failed"] + c["retry"] + c["skipped"], "ok": c["ok"],
            "failed": c["failed"], "retried": c["retry"],
            "skipped": c["skipped"], "handed_back": c["handed back"],
            "uptime_s": round(time.monotonic() - self.started, 3)})


def log_fire(fired: Fired, outcome: str) -> None:
    """One INFO line for a run that ended: which timer, how late, how long, how it ended."""
    lateness, duration = round(fired.lateness_ms, 1), round(
        fired.finished_ms - fired.started_ms, 1)
    error = (fired.outcome.error_type or fired.outcome.kind
             if outcome in ("retry", "failed") else None)
    fires_log.info(
        "fired %s (%s) attempt %d: %s%s, %.1f ms late, ran %.1f ms", plain(fired.timer_id),
        plain(fired.task or "?"), fired.attempt, outcome,
        f" ({plain(error)})" if error else "", lateness, duration,
        extra={"id": fired.timer_id, "task": fired.task, "attempt": fired.attempt,
               "source": fired.source, "lateness_ms": lateness, "duration_ms": duration,
               "outcome": outcome, **({"error": error} if error else {})})
