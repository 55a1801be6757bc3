"""Rate limits as a user writes them (``"100/m"``), and the spacing of starts they give."""

from __future__ import annotations

import pytest

from timers.model.flow.rates import Rate


@pytest.mark.parametrize(
    ("text", "count", "period_ms", "interval_ms"),
    [
        ("100/m", 100, 60_000, 600),
        ("5/s", 5, 1000, 200),
        ("100/h", 100, 3_600_000, 36_000),
        ("1000/d", 1000, 86_400_000, 86_400),
        ("10/30s", 10, 30_000, 3000),
        ("3/5m", 3, 300_000, 100_000),
        ("600/m", 600, 60_000, 100),
        (" 7 / 60s ", 7, 60_000, 8572),  # rounded up: never faster than asked
        ("5000/s", 5000, 1000, 1),  # at least 1 ms apart
    ],
)
def test_a_rate_is_read_as_written(text: str, count: int, period_ms: int,
                                   interval_ms: int) -> None:
    rate = Rate.parse(text)
    assert (rate.count, rate.period_ms, rate.burst) == (count, period_ms, 1)
    assert rate.interval_ms == interval_ms


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100/x", "rate '100/x' must look like '100/m' (per s, m, h or d; e.g. '10/30s')"),
        ("100", "rate '100' must look like '100/m' (per s, m, h or d; e.g. '10/30s')"),
        ("/m", "rate '/m' must look like '100/m' (per s, m, h or d; e.g. '10/30s')"),
        ("-1/m", "rate '-1/m' must look like '100/m' (per s, m, h or d; e.g. '10/30s')"),
        ("1.5/m", "rate '1.5/m' must look like '100/m' (per s, m, h or d; e.g. '10/30s')"),
        ("100/min", "rate '100/min' must look like '100/m' (per s, m, h or d; e.g. '10/30s')"),
        ("0/m", "rate '0/m' must allow at least 1 start per period"),
        ("5/0s", "rate '5/0s' needs a period of at least 1s"),
    ],
)
def test_a_bad_rate_is_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        Rate.parse(text)
    assert str(err.value) == message


def test_a_rate_that_is_not_text_is_refused() -> None:
    with pytest.raises(ValueError) as err:
        Rate.parse(100)  # type: ignore[arg-type]
    assert str(err.value) == "rate must be a string such as '100/m', got int"


@pytest.mark.parametrize("burst", [0, -1, True, 1.5])
def test_a_bad_burst_is_refused(burst: object) -> None:
    with pytest.raises(ValueError) as err:
        Rate.parse("100/m", burst)  # type: ignore[arg-type]
    assert str(err.value) == f"burst must be an integer of 1 or more, got {burst!r}"


def test_a_rate_made_directly_is_checked() -> None:
    with pytest.raises(ValueError) as err:
        Rate(0, 1000)
    assert str(err.value) == "rate count must be an integer of 1 or more, got 0"


@pytest.mark.parametrize(
    ("text", "shown"),
    [("100/m", "100/m"), ("10/30s", "10/30s"), ("60/60s", "60/m"), ("3/5m", "3/5m"),
     ("1/24h", "1/d"), ("2/90m", "2/90m"), ("1000/d", "1000/d")],
)
def test_a_rate_reads_back_in_the_form_it_was_written(text: str, shown: str) -> None:
    rate = Rate.parse(text)
    assert str(rate) == shown
    assert Rate.parse(str(rate)) == rate


def test_a_burst_shows_in_the_readable_form() -> None:
    assert str(Rate.parse("100/m", burst=5)) == "100/m (burst 5)"
    assert str(Rate(3, 1500)) == "3/1500ms"
