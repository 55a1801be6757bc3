"""A task that just records its call."""

from __future__ import annotations

from tests.retry_tasks import note_call, note_done


def hit(tag: str) -> None:
    note_call(tag)
    note_done(tag)
