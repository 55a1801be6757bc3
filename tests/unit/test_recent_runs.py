"""A listener's heartbeat says how many runs started in the last minute and how late."""

from __future__ import annotations

from timers.listener.health.recent import RecentRuns


def test_the_summary_covers_the_last_minute_only() -> None:
    now = [1000.0]
    recent = RecentRuns(clock=lambda: now[0])
    assert recent.summary() == {"runs_last_minute": 0, "lateness_p50_ms": None,
                                "lateness_p99_ms": None, "busiest_tasks": []}
    for lateness in (50.0, 60.0):  # an old burst, late
        recent.started(lateness)
    now[0] += 61
    for i, lateness in enumerate([0.2] * 98 + [0.4, 9.0]):
        recent.started(lateness, "mail.send" if i % 4 else "sms.send")
    assert recent.summary() == {"runs_last_minute": 100, "lateness_p50_ms": 0.2,
                                "lateness_p99_ms": 0.4,
                                "busiest_tasks": [["mail.send", 75], ["sms.send", 25]]}
    now[0] += 61
    assert recent.summary()["runs_last_minute"] == 0
