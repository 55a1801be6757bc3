"""What happens to a claimed occurrence: :func:`timers.model.cron.plan`, with injected times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from timers.model.cron import CATCH_UP_VALUES, NONE_GRACE, CatchUp, Step, plan
from timers.model.cron.schedule import CronSchedule, IntervalSchedule, to_ms

ANCHOR = datetime(2025, 1, 1, tzinfo=UTC)
MINUTE = 60_000
EVERY_MINUTE = IntervalSchedule(timedelta(minutes=1), ANCHOR)
A = to_ms(ANCHOR)


def at(minutes: float) -> int:
    """Epoch ms ``minutes`` after the anchor."""
    return A + round(minutes * MINUTE)


def test_on_time_runs_and_schedules_the_next() -> None:
    assert plan(EVERY_MINUTE, "latest", None, at(1), at(1) + 3) == Step(True, at(2))


def test_late_but_still_the_latest_runs_in_every_mode_within_the_grace() -> None:
    for mode in CATCH_UP_VALUES:
        assert plan(EVERY_MINUTE, mode, None, at(1), at(1.5)) == Step(True, at(2))


def test_catch_up_latest_skips_to_the_latest_missed_occurrence() -> None:
    step = plan(EVERY_MINUTE, "latest", None, at(1), at(5.5))
    assert (step.run, step.successor, step.defer) == (False, at(5), False)
    assert "latest" in step.reason
    # …which then runs, and the chain goes on after now
    assert plan(EVERY_MINUTE, "latest", None, at(5), at(5.5) + 10) == Step(True, at(6))


def test_catch_up_all_runs_each_missed_one_in_order() -> None:
    now = at(4.5)
    due, ran = at(1), []
    while True:
        step = plan(EVERY_MINUTE, "all", None, due, now)
        assert step.run
        ran.append(due)
        if not step.defer:
            break  # the latest: its successor is in the future, scheduled at once
        due = step.successor  # scheduled when the run ends
        now += 1000  # each run takes a second
    assert ran == [at(1), at(2), at(3), at(4)]
    assert step.successor == at(5)


def test_catch_up_none_skips_everything_missed_and_goes_on_after_now() -> None:
    step = plan(EVERY_MINUTE, "none", None, at(1), at(5.5))
    assert (step.run, step.successor) == (False, at(6))
    assert "none" in step.reason


def test_catch_up_none_counts_as_missed_past_its_grace() -> None:
    daily = IntervalSchedule(timedelta(days=1), ANCHOR)
    due = to_ms(ANCHOR + timedelta(days=1))
    grace = NONE_GRACE // timedelta(milliseconds=1)
    assert plan(daily, "none", None, due, due + grace).run
    step = plan(daily, "none", None, due, due + grace + 1)
    assert not step.run and step.successor == due + 86_400_000
    # an explicit max_lateness replaces the grace
    assert plan(daily, "none", timedelta(hours=2), due, due + 3_600_000).run


def test_max_lateness_skips_a_late_occurrence_but_keeps_the_chain() -> None:
    step = plan(EVERY_MINUTE, "latest", timedelta(seconds=10), at(1), at(1) + 10_001)
    assert (step.run, step.successor) == (False, at(2))
    assert "max lateness" in step.reason


def test_max_lateness_with_catch_up_all_starts_from_the_first_one_in_time() -> None:
    step = plan(EVERY_MINUTE, "all", timedelta(minutes=2), at(1), at(10.5))
    assert (step.run, step.successor) == (False, at(9))
    assert plan(EVERY_MINUTE, "all", timedelta(minutes=2), at(9), at(10.5) + 5).run


def test_max_lateness_with_catch_up_latest_when_even_the_latest_is_too_late() -> None:
    hourly = IntervalSchedule(timedelta(hours=1), ANCHOR)
    due = to_ms(ANCHOR + timedelta(hours=1))
    now = to_ms(ANCHOR + timedelta(hours=5, minutes=30))
    step = plan(hourly, "latest", timedelta(minutes=10), due, now)
    assert (step.run, step.successor) == (False, to_ms(ANCHOR + timedelta(hours=6)))


@pytest.mark.parametrize("mode", ["latest", "all", "none"])
def test_a_rerun_runs_whatever_the_catch_up_policy(mode: CatchUp) -> None:
    step = plan(EVERY_MINUTE, mode, None, at(1), at(5.5), rerun=True)
    assert step.run
    limited = plan(EVERY_MINUTE, mode, timedelta(seconds=30), at(1), at(5.5),
                   rerun=True, lateness_ms=20_000)
    assert limited.run
    too_late = plan(EVERY_MINUTE, mode, timedelta(seconds=30), at(1), at(5.5),
                    rerun=True, lateness_ms=40_000)
    assert not too_late.run


@pytest.mark.parametrize("mode", ["latest", "all", "none"])
def test_every_successor_is_later_than_the_occurrence(mode: CatchUp) -> None:
    for late_minutes in (0, 0.5, 1, 2.5, 100):
        for limit in (None, timedelta(0), timedelta(seconds=30), timedelta(minutes=5)):
            step = plan(EVERY_MINUTE, mode, limit, at(3), at(3 + late_minutes))
            assert step.successor > at(3)


def test_cron_catch_up_latest_over_a_dst_change() -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Berlin")
    due = to_ms(datetime(2025, 3, 28, 1, 30, tzinfo=UTC))  # 02:30 CET
    now = to_ms(datetime(2025, 3, 31, 12, tzinfo=UTC))
    step = plan(schedule, "latest", None, due, now)
    assert step.successor == to_ms(datetime(2025, 3, 31, 0, 30, tzinfo=UTC))  # 02:30 CEST
    step = plan(schedule, "all", None, due, now)
    assert step.defer and step.successor == to_ms(datetime(2025, 3, 29, 1, 30, tzinfo=UTC))
    assert plan(schedule, "all", None, step.successor, now).successor == to_ms(
        datetime(2025, 3, 30, 1, tzinfo=UTC))  # 03:00 CEST: the end of the gap


def test_a_rerun_too_late_to_run_does_not_defer_its_successor() -> None:
    step = plan(EVERY_MINUTE, "all", timedelta(seconds=30), at(1), at(3.5), rerun=True,
                lateness_ms=40_000)
    assert not step.run and not step.defer
    assert step.successor == at(3)  # the first occurrence still within its max lateness
