"""``timers.current()``: a running task sees its own timer (id, task, attempt, due time,
lateness, recurrence), in a thread, on the event loop and in a quarantine child."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis
import pytest

import timers
from tests.unit.helpers import run_burst
from timers import Timers

PAST = datetime(2001, 1, 1, tzinfo=UTC)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("task", ["ctx.sync_note", "ctx.async_note"])
def test_a_task_sees_its_timer(task: str, server: fakeredis.FakeServer, producer: Timers,
                               tmp_path: Path) -> None:
    out = tmp_path / "ctx.jsonl"
    due = datetime(2001, 1, 1, 12, tzinfo=UTC)
    producer.schedule(task, [str(out)], at=due, id="signup-42")
    run_burst(server)
    (seen,) = lines(out)
    assert (seen["id"], seen["task"], seen["attempt"], seen["recurrence"]) == (
        "signup-42", task, 1, None)
    assert seen["due"] == seen["original_due"] == due.isoformat()
    assert seen["lateness"] > 365 * 86400  # due in 2001
    # a plain function runs in a worker thread, a coroutine on the loop: both see it
    assert seen["thread"] == ("timers-task" if task == "ctx.sync_note" else "MainThread")


@pytest.mark.parametrize("task", ["ctx.fails_once", "ctx.async_fails_once"])
def test_a_retry_sees_attempt_2_and_the_same_id(
        task: str, server: fakeredis.FakeServer, producer: Timers, tmp_path: Path) -> None:
    out = tmp_path / "ctx.jsonl"
    producer.schedule(task, [str(out)], at=PAST, id="pay-7")
    run_burst(server)  # one burst: the retry, due at once, is due before it ends
    first, second = lines(out)
    assert [first["attempt"], second["attempt"]] == [1, 2]
    assert first["id"] == second["id"] == "pay-7"
    assert first["original_due"] == second["original_due"] == PAST.isoformat()
    assert second["due"] > first["due"], "a retry's own due time is its backoff's end"
    stats = producer.stats()
    assert (stats.pending, stats.fired, stats.failed) == (0, 1, 0)


def test_an_occurrence_of_a_recurrence_names_it(
        server: fakeredis.FakeServer, producer: Timers, tmp_path: Path) -> None:
    out = tmp_path / "ctx.jsonl"
    producer.every("nightly report", "ctx.sync_note", [str(out)], interval=timedelta(days=1))
    (occurrence,) = producer.list()
    producer.reschedule(occurrence.id, in_=0)
    run_burst(server)
    (seen,) = lines(out)
    assert seen["recurrence"] == "nightly report"
    assert seen["id"] == occurrence.id


def test_outside_a_task_current_raises_a_clear_error() -> None:
    with pytest.raises(timers.NotInTimer, match=r"called outside a timer's task"):
        timers.current()
    assert issubclass(timers.NotInTimer, timers.TimersError)
