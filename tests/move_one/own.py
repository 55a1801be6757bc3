"""The staying app's task: each run written to the file ledger of :mod:`tests.fault_tasks`."""

from __future__ import annotations

from tests.fault_tasks import ledger


def mark(tid: str) -> None:
    """Record the run of ``tid`` (start and end) in ``$TIMERS_FAULT_LEDGER``."""
    ledger.mark(tid)
