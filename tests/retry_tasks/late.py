"""A task whose policy bounds its lateness (``ok.hit`` is one without a policy)."""

from __future__ import annotations

from tests.retry_tasks import note_call, note_done
from timers import task

TASK_MAX_LATENESS = 5.0


@task(max_lateness=TASK_MAX_LATENESS)
def limited(tag: str) -> None:
    note_call(tag)
    note_done(tag)
