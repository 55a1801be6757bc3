"""A claimed run reads its attempt count from the record's options."""

from __future__ import annotations

import pytest

from timers.model.runs import Run


def run_of(record_text: str, reruns: int = 0) -> Run:
    return Run.parse(b"tok", f"{reruns}|1700000000000|id1:{record_text}".encode(), b"s")


@pytest.mark.parametrize(
    ("record_text", "reruns", "attempt"),
    [
        ('reminders.sms:["x"]', 0, 1),
        ('reminders.sms;a=2:["x"]', 0, 3),
        ('reminders.sms;a=2;f=17:["x"]', 1, 4),
        ('reminders.sms;f=17;a=4:{"k":"a=9"}', 0, 5),
        ("reminders.sms;a=x:[]", 0, 1),
        ("reminders.sms;a=\u00b2:[]", 0, 1),
        ("not a record", 2, 3),
    ],
)
def test_attempt_counts_failed_attempts_and_crash_reruns(
    record_text: str, reruns: int, attempt: int
) -> None:
    run = run_of(record_text, reruns)
    assert run.attempt == attempt
    assert (run.due_ms, run.escaped_id, run.source) == (1700000000000, "id1", "sweep")
