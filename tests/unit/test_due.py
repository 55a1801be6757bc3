"""Due times: the ``in_``/``at`` arguments, and human durations for the CLI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from timers.exceptions import InvalidDueTime
from timers.model.due import due_spec, format_duration, parse_duration

# -- due_spec ----------------------------------------------------------------------------


def test_in_seconds_is_relative_ms() -> None:
    assert due_spec(30, None) == ("in", 30_000)
    assert due_spec(0.25, None) == ("in", 250)
    assert due_spec(0, None) == ("in", 0)


def test_in_timedelta() -> None:
    assert due_spec(timedelta(minutes=1, milliseconds=500), None) == ("in", 60_500)


def test_past_is_allowed() -> None:
    assert due_spec(-5, None) == ("in", -5000)
    assert due_spec(timedelta(seconds=-1), None) == ("in", -1000)
    assert due_spec(None, datetime(2000, 1, 1, tzinfo=UTC)) == ("at", 946_684_800_000)


def test_at_is_epoch_ms_whatever_the_zone() -> None:
    utc = datetime(2030, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    plus2 = utc.astimezone(timezone(timedelta(hours=2)))
    assert due_spec(None, utc) == ("at", round(utc.timestamp() * 1000))
    assert due_spec(None, plus2) == due_spec(None, utc)
    assert due_spec(None, utc)[1] % 1000 == 123


@pytest.mark.parametrize(
    ("in_", "at"), [(None, None), (5, datetime(2030, 1, 1, tzinfo=UTC))]
)
def test_exactly_one_of_in_and_at(in_: float | None, at: datetime | None) -> None:
    with pytest.raises(InvalidDueTime, match="exactly one"):
        due_spec(in_, at)


def test_naive_datetime_is_refused() -> None:
    with pytest.raises(InvalidDueTime, match="timezone-aware"):
        due_spec(None, datetime(2030, 1, 1))


def test_at_must_be_a_datetime() -> None:
    with pytest.raises(InvalidDueTime, match="str"):
        due_spec(None, "2030-01-01T00:00:00Z")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_in_is_refused(value: float) -> None:
    with pytest.raises(InvalidDueTime, match="finite"):
        due_spec(value, None)


@pytest.mark.parametrize(("value", "type_name"), [(True, "bool"), ("30", "str"), ([1], "list")])
def test_in_of_the_wrong_type_is_refused(value: object, type_name: str) -> None:
    with pytest.raises(InvalidDueTime, match=type_name):
        due_spec(value, None)  # type: ignore[arg-type]


def test_invalid_due_time_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        due_spec(None, None)


# -- parse_duration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0.5", 0.5),
        ("30s", 30.0),
        ("250ms", 0.25),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("1m 30s", 90.0),
        (" 5M ", 300.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", " ", "abc", "5x", "-", "m", "h5", "5m-", "1h-30m", "nan", "inf", "1,5h", "5mm"]
)
def test_bad_durations_say_what_is_accepted(text: str) -> None:
    with pytest.raises(InvalidDueTime) as info:
        parse_duration(text)
    message = str(info.value)
    assert repr(text) in message
    assert "30s" in message and "1h30m" in message


# -- format_duration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0ms"),
        (0.25, "250ms"),
        (5, "5.0s"),
        (59.5, "59.5s"),
        (90, "1m 30s"),
        (3600, "1h"),
        (7500, "2h 5m"),
        (93784, "1d 2h"),
        (-3.2, "-3.2s"),
        (-0.004, "-4ms"),
        (-7500, "-2h 5m"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0.25, 30, 300, 7200, 86400])
def test_format_then_parse_round_trips_whole_units(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
