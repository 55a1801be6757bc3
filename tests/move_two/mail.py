"""The moving app's task: each run written to the file ledger of :mod:`tests.fault_tasks`."""

from __future__ import annotations

import time

import timers
from tests.fault_tasks import ledger


@timers.task(retries=1, backoff=[1.0])
def mark(tid: str, fail_after: float = 0.0) -> None:
    """Record the run of ``tid`` (start and end) in ``$TIMERS_FAULT_LEDGER``. With
    ``fail_after``, the first attempt works that many seconds and fails, writing nothing;
    it is retried a second later."""
    if fail_after and timers.current().attempt == 1:
        time.sleep(fail_after)  # the work itself, which then fails
        raise RuntimeError(f"{tid}: the first attempt fails")
    ledger.mark(tid)
