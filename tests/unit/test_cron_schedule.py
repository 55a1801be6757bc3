"""Next-occurrence maths: pure functions of fixed datetimes, DST changes included.

Zones and dates (2025): Europe/Berlin springs forward on 30 March (02:00 CET → 03:00 CEST)
and falls back on 26 October (03:00 CEST → 02:00 CET); America/New_York on 9 March and
2 November at 02:00; America/Santiago springs forward at midnight (6 → 7 September);
Australia/Lord_Howe falls back by 30 minutes on 6 April.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from timers.model.cron.schedule import CronSchedule, IntervalSchedule, from_ms, to_ms, upcoming

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def local(expr: str, tz: str, start: datetime, count: int) -> list[str]:
    """The next ``count`` occurrences as local ISO times with their offsets."""
    zone = ZoneInfo(tz)
    return [t.astimezone(zone).isoformat() for t in upcoming(CronSchedule(expr, tz), start,
                                                             count)]


def per_local_day(expr: str, tz: str, start: datetime, end: datetime) -> Counter[date]:
    zone = ZoneInfo(tz)
    schedule = CronSchedule(expr, tz)
    counts: Counter[date] = Counter()
    t = schedule.next_after(start)
    while t < end:
        counts[t.astimezone(zone).date()] += 1
        t = schedule.next_after(t)
    return counts


# -- what croniter alone does (why the wall-time maths exists) ---------------------------


def test_croniter_alone_runs_a_daily_0230_job_twice_on_the_fall_back_night() -> None:
    it = croniter("30 2 * * *", datetime(2025, 10, 25, 12, tzinfo=BERLIN))
    runs = [it.get_next(datetime) for _ in range(3)]
    assert [r.date() for r in runs] == [date(2025, 10, 26), date(2025, 10, 26),
                                        date(2025, 10, 27)]


# -- spring forward ----------------------------------------------------------------------


def test_daily_0230_runs_once_on_the_spring_forward_day_as_the_gap_ends() -> None:
    assert local("30 2 * * *", "Europe/Berlin", datetime(2025, 3, 28, 12, tzinfo=BERLIN), 4) == [
        "2025-03-29T02:30:00+01:00",
        "2025-03-30T03:00:00+02:00",  # 02:30 does not exist that day
        "2025-03-31T02:30:00+02:00",
        "2025-04-01T02:30:00+02:00",
    ]


def test_daily_0230_new_york_spring_forward() -> None:
    assert local("30 2 * * *", "America/New_York", datetime(2025, 3, 8, 12, tzinfo=NEW_YORK),
                 3) == ["2025-03-09T03:00:00-04:00", "2025-03-10T02:30:00-04:00",
                        "2025-03-11T02:30:00-04:00"]


def test_times_inside_the_gap_collapse_into_one_run() -> None:
    assert local("*/15 2 * * *", "Europe/Berlin", datetime(2025, 3, 29, 12, tzinfo=BERLIN),
                 3) == ["2025-03-30T03:00:00+02:00", "2025-03-31T02:00:00+02:00",
                        "2025-03-31T02:15:00+02:00"]


def test_midnight_that_does_not_exist_runs_at_one() -> None:
    santiago = ZoneInfo("America/Santiago")
    assert local("0 0 * * *", "America/Santiago", datetime(2025, 9, 5, 12, tzinfo=santiago),
                 3) == ["2025-09-06T00:00:00-04:00", "2025-09-07T01:00:00-03:00",
                        "2025-09-08T00:00:00-03:00"]


# -- fall back ---------------------------------------------------------------------------


def test_daily_0230_runs_once_on_the_fall_back_day_at_the_first_pass() -> None:
    assert local("30 2 * * *", "Europe/Berlin", datetime(2025, 10, 24, 12, tzinfo=BERLIN),
                 3) == ["2025-10-25T02:30:00+02:00", "2025-10-26T02:30:00+02:00",
                        "2025-10-27T02:30:00+01:00"]


def test_after_the_first_pass_the_second_pass_is_not_a_run() -> None:
    second_pass = datetime(2025, 10, 26, 2, 10, fold=1, tzinfo=BERLIN)
    assert local("30 2 * * *", "Europe/Berlin", second_pass, 1) == ["2025-10-27T02:30:00+01:00"]
    first_pass = datetime(2025, 10, 26, 2, 10, tzinfo=BERLIN)
    assert local("30 2 * * *", "Europe/Berlin", first_pass, 1) == ["2025-10-26T02:30:00+02:00"]


def test_new_york_0130_once_on_the_fall_back_day() -> None:
    assert local("30 1 * * *", "America/New_York", datetime(2025, 11, 1, 12, tzinfo=NEW_YORK),
                 2) == ["2025-11-02T01:30:00-04:00", "2025-11-03T01:30:00-05:00"]


def test_half_hour_fall_back_in_lord_howe() -> None:
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    assert local("45 1 * * *", "Australia/Lord_Howe", datetime(2025, 4, 5, 12,
                                                               tzinfo=lord_howe), 2) == [
        "2025-04-06T01:45:00+11:00", "2025-04-07T01:45:00+10:30"]


@pytest.mark.parametrize(("tz", "expr"), [
    ("Europe/Berlin", "30 2 * * *"), ("Europe/Berlin", "0 2 * * *"),
    ("Europe/Berlin", "59 2 * * *"), ("America/New_York", "30 1 * * *"),
    ("America/New_York", "30 2 * * *"), ("Australia/Sydney", "30 2 * * *"),
    ("Australia/Lord_Howe", "45 1 * * *"), ("America/Santiago", "0 0 * * *"),
    ("Europe/London", "30 1 * * *"),
])
def test_a_daily_job_runs_exactly_once_every_local_day_of_a_year(tz: str, expr: str) -> None:
    zone = ZoneInfo(tz)
    start = datetime(2024, 12, 31, 12, tzinfo=zone)
    counts = per_local_day(expr, tz, start, datetime(2026, 1, 1, tzinfo=zone))
    assert set(counts.values()) == {1}
    assert len(counts) == 365


# -- wall time kept across changes -------------------------------------------------------


def test_0900_berlin_stays_0900_local_across_both_changes() -> None:
    spring = local("0 9 * * mon-fri", "Europe/Berlin", datetime(2025, 3, 27, 12, tzinfo=BERLIN),
                   3)
    assert spring == ["2025-03-28T09:00:00+01:00", "2025-03-31T09:00:00+02:00",
                      "2025-04-01T09:00:00+02:00"]
    autumn = local("0 9 * * mon-fri", "Europe/Berlin",
                   datetime(2025, 10, 23, 12, tzinfo=BERLIN), 3)
    assert autumn == ["2025-10-24T09:00:00+02:00", "2025-10-27T09:00:00+01:00",
                      "2025-10-28T09:00:00+01:00"]
    # the same local time is one hour apart in UTC
    assert datetime.fromisoformat(spring[0]).astimezone(UTC).hour == 8
    assert datetime.fromisoformat(spring[1]).astimezone(UTC).hour == 7


# -- jobs that run every hour follow real time -------------------------------------------


def test_every_30_minutes_runs_through_the_repeated_hour_twice() -> None:
    assert local("*/30 * * * *", "Europe/Berlin", datetime(2025, 10, 26, 1, 10, tzinfo=BERLIN),
                 7) == [
        "2025-10-26T01:30:00+02:00", "2025-10-26T02:00:00+02:00", "2025-10-26T02:30:00+02:00",
        "2025-10-26T02:00:00+01:00", "2025-10-26T02:30:00+01:00", "2025-10-26T03:00:00+01:00",
        "2025-10-26T03:30:00+01:00",
    ]


def test_every_30_minutes_skips_the_missing_hour_without_an_extra_run() -> None:
    assert local("*/30 * * * *", "Europe/Berlin", datetime(2025, 3, 30, 1, 10, tzinfo=BERLIN),
                 3) == ["2025-03-30T01:30:00+01:00", "2025-03-30T03:00:00+02:00",
                        "2025-03-30T03:30:00+02:00"]


def test_hourly_runs_are_an_hour_of_real_time_apart_through_a_whole_year() -> None:
    schedule = CronSchedule("5 * * * *", "Europe/Berlin")
    t = schedule.next_after(datetime(2025, 1, 1, tzinfo=UTC))
    for _ in range(24 * 366):
        following = schedule.next_after(t)
        assert following - t == timedelta(hours=1)
        t = following


def test_from_the_second_pass_an_hourly_job_continues_in_it() -> None:
    second_pass = datetime(2025, 10, 26, 2, 10, fold=1, tzinfo=BERLIN)
    assert local("*/15 * * * *", "Europe/Berlin", second_pass, 2) == [
        "2025-10-26T02:15:00+01:00", "2025-10-26T02:30:00+01:00"]


# -- previous occurrence, seconds, sparse expressions ------------------------------------


def test_latest_at_or_before() -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Berlin")
    at = datetime(2025, 10, 27, 12, tzinfo=BERLIN)
    assert schedule.latest_at_or_before(at) == datetime(2025, 10, 27, 2, 30, tzinfo=BERLIN)
    # ambiguous local times compare unequal across zones (PEP 495): compare in UTC
    exact = datetime(2025, 10, 26, 2, 30, tzinfo=BERLIN).astimezone(UTC)
    assert schedule.latest_at_or_before(exact) == exact
    hourly = CronSchedule("*/30 * * * *", "Europe/Berlin")
    second_pass = datetime(2025, 10, 26, 2, 40, fold=1, tzinfo=BERLIN).astimezone(UTC)
    assert hourly.latest_at_or_before(second_pass) == second_pass - timedelta(minutes=10)


def test_seconds_field_and_sparse_expressions() -> None:
    every_5s = CronSchedule("* * * * * */5")
    start = datetime(2025, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert upcoming(every_5s, start, 2) == [start.replace(second=5), start.replace(second=10)]
    leap = CronSchedule("0 12 29 2 *", "Europe/Berlin")
    assert leap.next_after(datetime(2025, 1, 1, tzinfo=UTC)) == datetime(2028, 2, 29, 11,
                                                                          tzinfo=UTC)


def test_naive_after_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        CronSchedule("* * * * *").next_after(datetime(2025, 1, 1))


def test_hash_fields_are_the_same_in_every_process_for_one_name() -> None:
    a = CronSchedule("H 9 * * *", hash_id="report")
    b = CronSchedule("H 9 * * *", hash_id="report")
    start = datetime(2025, 1, 1, tzinfo=UTC)
    assert a.next_after(start) == b.next_after(start)


# -- intervals ---------------------------------------------------------------------------


def test_interval_counts_from_its_anchor() -> None:
    anchor = datetime(2025, 1, 1, tzinfo=UTC)
    schedule = IntervalSchedule(timedelta(minutes=5), anchor)
    assert schedule.next_after(anchor) == anchor + timedelta(minutes=5)
    assert schedule.next_after(anchor - timedelta(days=1)) == anchor + timedelta(minutes=5)
    assert schedule.next_after(anchor + timedelta(minutes=5)) == anchor + timedelta(minutes=10)
    assert schedule.next_after(anchor + timedelta(minutes=7)) == anchor + timedelta(minutes=10)
    assert schedule.latest_at_or_before(anchor + timedelta(minutes=14)) == anchor + timedelta(
        minutes=10)
    assert schedule.latest_at_or_before(anchor + timedelta(minutes=4)) is None


def test_interval_ignores_dst() -> None:
    anchor = datetime(2025, 3, 30, 0, 30, tzinfo=BERLIN)
    schedule = IntervalSchedule(timedelta(hours=1), anchor)
    times = upcoming(schedule, anchor, 3)
    assert [b - a for a, b in zip([anchor, *times], times, strict=False)] == [
        timedelta(hours=1)] * 3


def test_ms_conversions_are_exact() -> None:
    for ms in (0, 1, 1_700_000_000_123, 253_402_300_799_999):
        assert to_ms(from_ms(ms)) == ms


# -- properties over many instants -------------------------------------------------------

EXPRESSIONS = ["30 2 * * *", "*/15 * * * *", "0 9 * * mon-fri", "15 1-3 * * *",
               "0 0 1 * *", "*/7 2 * * *", "5 * * * *"]
ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "UTC"]


@settings(max_examples=300, deadline=None)
@given(
    expr=st.sampled_from(EXPRESSIONS),
    tz=st.sampled_from(ZONES),
    instant=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2027, 1, 1),
                         timezones=st.just(UTC)),
)
def test_next_is_later_monotonic_and_consistent_with_previous(
    expr: str, tz: str, instant: datetime
) -> None:
    schedule = CronSchedule(expr, tz)
    following = schedule.next_after(instant)
    assert following > instant
    # nothing in between: the occurrence just before `following` is at or before `instant`
    before = schedule.latest_at_or_before(following - timedelta(microseconds=1))
    assert before is None or before <= instant
    assert schedule.latest_at_or_before(following) == following
    assert schedule.next_after(instant + (following - instant) / 2) == following
    zone = ZoneInfo(tz)
    wall = following.astimezone(zone)
    just_before = (following - timedelta(seconds=1)).astimezone(zone)
    gap_end = wall.utcoffset() != just_before.utcoffset()
    assert croniter.match(expr, wall.replace(tzinfo=None)) or gap_end
