"""How a listener's runs went over the last minute, for its heartbeat: how many started and
how late (p50/p99), so ``timers top`` and the dashboard show lateness across the fleet
without a metrics server."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from timers.model.percentiles import percentile

WINDOW = 60.0
"""Seconds of runs the summary covers."""
KEPT = 10_000
"""The most recent runs kept: above this many a minute, the percentiles come from the
latest ones."""
BUSIEST = 5
"""Tasks named in the summary, those that ran most in the window."""


class RecentRuns:
    """The lateness of the runs that started in the last :data:`WINDOW` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._runs: deque[tuple[float, float, str]] = deque(maxlen=KEPT)
        self._count: deque[float] = deque()

    def started(self, lateness_ms: float, task: str = "") -> None:
        now = self.clock()
        self._runs.append((now, lateness_ms, task))
        count = self._count
        count.append(now)
        if count[0] < now - WINDOW:  # (a run per call on the hot path: looked at here)
            self._forget(now)

    def _forget(self, now: float) -> None:
        while self._count and self._count[0] < now - WINDOW:
            self._count.popleft()
        while self._runs and self._runs[0][0] < now - WINDOW:
            self._runs.popleft()

    def summary(self) -> dict[str, Any]:
        """``runs_last_minute``, ``lateness_p50_ms`` / ``lateness_p99_ms`` (None when
        nothing ran) and ``busiest_tasks`` (``[task, runs]``, most first)."""
        self._forget(self.clock())
        late = [lateness for _, lateness, _ in self._runs]
        busiest = Counter(task for _, _, task in self._runs if task).most_common(BUSIEST)
        p50, p99 = percentile(late, 50), percentile(late, 99)
        return {"runs_last_minute": len(self._count),
                "lateness_p50_ms": None if math.isnan(p50) else round(p50, 2),
                "lateness_p99_ms": None if math.isnan(p99) else round(p99, 2),
                "busiest_tasks": [[task, n] for task, n in busiest]}
