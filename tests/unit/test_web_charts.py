"""The dashboard's charts and the figures behind them, as pure functions: points in, SVG
out; per-minute rows in, chart series out; counter samples in, rates out (a counter reset
never reads as a negative rate)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from timers.model.due import interval_words
from timers.model.history import MinuteStats
from timers.web.charts import Chart, Series, nice_ticks, number_text, render, time_ticks
from timers.web.figures import (
    Sample,
    increase,
    lateness_chart,
    per_minute,
    throughput_chart,
    window,
)
from timers.web.pages import recurrence_state

T0 = datetime(2026, 11, 26, 14, 0, tzinfo=UTC).timestamp()


def ys(svg: str, kind: str) -> list[float]:
    """The y coordinates of a line series' points."""
    found = re.search(rf'<polyline class="series-{kind}" fill="none" points="([^"]+)"', svg)
    assert found, kind
    return [float(p.split(",")[1]) for p in found.group(1).split()]


def test_ticks_are_round_and_cover_the_top() -> None:
    assert nice_ticks(7) == [0, 2, 4, 6, 8]
    assert nice_ticks(100) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.3) == [0, 0.1, 0.2, 0.3]
    assert nice_ticks(0) == [0, 1] and nice_ticks(float("nan")) == [0, 1]
    assert number_text(1200) == "1,200" and number_text(2.5) == "2.5"


def test_time_ticks_fall_on_round_minutes_and_are_few() -> None:
    hour = time_ticks(T0 + 30, T0 + 3630)
    assert len(hour) <= 7 and all(t % 600 == 0 for t in hour)
    day = time_ticks(T0, T0 + 86_400)
    assert len(day) <= 7 and all(t % 3600 == 0 for t in day)


def test_p50_and_p99_share_one_scale_so_p99_is_never_drawn_under_p50() -> None:
    chart = Chart("c", "lateness", "ms", T0, 60, [Series("p50", "p50", [5, 10, 20]),
                                                 Series("p99", "p99", [50, 400, 80])])
    svg = str(render(chart))
    # one scale: higher values are higher up (smaller y) across both lines
    for p50, p99 in zip(ys(svg, "p50"), ys(svg, "p99"), strict=True):
        assert p99 < p50
    assert ys(svg, "p99")[1] == min(ys(svg, "p50") + ys(svg, "p99"))
    labels = re.findall(r'<text class="tick"[^>]*text-anchor="end">([^<]+)</text>', svg)
    assert labels == ["0", "100", "200", "300", "400"]  # the axis reaches the highest value
    assert '<text class="unit" x="4" y="14">ms</text>' in svg
    assert "14:00" in svg and "<title>lateness (ms)</title>" in svg


def test_a_gap_breaks_the_line_and_no_data_says_so() -> None:
    svg = str(render(Chart("c", "t", "ms", T0, 60, [Series("p50", "p50",
                                                           [1, 2, None, 4, 5])])))
    assert svg.count('<polyline class="series-p50"') == 2
    empty = str(render(Chart("c", "t", "ms", T0, 60, [Series("p50", "p50", [None] * 5)])))
    assert "no data yet" in empty and "<polyline" not in empty


def test_bars_are_drawn_for_counts_and_zero_draws_nothing() -> None:
    svg = str(render(Chart("c", "t", "runs / min", T0, 60,
                           [Series("runs", "runs", [3, 0, None, 6])], bars=True)))
    assert len(re.findall(r'<rect class="bar series-runs" x=', svg)) == 2
    assert len(re.findall(r'<rect class="key series-runs" x=', svg)) == 1  # the legend


def test_every_text_is_escaped() -> None:
    svg = str(render(Chart('"><script>x</script>', "<b>t</b>", "<i>ms</i>", T0, 60,
                           [Series("<img src=x>", "p50\"onload=\"x", [1, 2])])))
    assert "<script>" not in svg and "<b>" not in svg and "<img" not in svg
    assert 'onload="' not in svg and "&lt;i&gt;ms&lt;/i&gt;" in svg


def test_a_counter_that_drops_was_reset_never_a_negative_rate() -> None:
    assert increase(10, 15) == 5
    assert increase(1000, 3) == 3  # a Redis restart: 3 since
    samples = [Sample(T0, 100, 0, 0), Sample(T0 + 30, 130, 1, 2), Sample(T0 + 60, 4, 0, 0),
               Sample(T0 + 90, 10, 0, 1)]
    rates = per_minute(samples, T0 + 90)
    assert rates is not None
    runs, failures = rates
    assert runs == pytest.approx((33 + 4 + 7) / 1.5) and failures == pytest.approx(4 / 1.5)
    assert per_minute(samples[:1], T0) is None
    burst = per_minute([Sample(T0, 0, 0, 0), Sample(T0 + 6, 33, 0, 0)], T0 + 6)
    assert burst == (33, 0)  # 33 runs seen in 6 s: not 330 a minute


def test_the_lateness_chart_puts_each_minute_in_its_place_and_no_row_is_a_gap() -> None:
    rows = [MinuteStats(int(T0), 4, 0, 3.0, 30.0), MinuteStats(int(T0) + 180, 1, 0, 2.0, 5.0)]
    chart = lateness_chart("l", "lateness", rows, T0 + 200, 60)
    assert chart.unit == "ms" and chart.count == 60
    p50, p99 = chart.series[0].values, chart.series[1].values
    assert p99.count(None) == 58 and p99[-4:] == [30.0, None, None, 5.0]
    assert p50[-4:] == [3.0, None, None, 2.0]


def test_a_day_is_drawn_in_15_minute_bars_with_its_unit() -> None:
    start, count = window(T0 + 3599, 1440, 15)
    assert count == 96 and start % 900 == 0 and start + 96 * 900 > T0 + 3599
    rows = [MinuteStats(int(T0) + 60 * i, 2, 1 if i % 2 else 0) for i in range(30)]
    chart = throughput_chart("d", "day", rows, T0 + 1799, 1440, 15)
    assert chart.unit == "runs / 15 min" and chart.bars
    runs = [v for v in chart.series[0].values if v is not None]
    assert runs == [30, 30] and [v for v in chart.series[1].values if v is not None] == [7, 8]


def test_recurrences_read_as_people_say_them() -> None:
    assert interval_words(5) == "5s" and interval_words(90) == "1m 30s"
    assert interval_words(7200) == "2h" and interval_words(0.25) == "250ms"
    now = datetime.now(UTC)
    assert recurrence_state(False, False, now + timedelta(seconds=5), now) == "waiting"
    assert recurrence_state(False, False, now - timedelta(seconds=5), now) == "overdue"
    assert recurrence_state(False, True, None, now) == "running"
    assert recurrence_state(False, True, now, now) == "running"
    assert recurrence_state(False, False, None, now) == "idle"
    assert recurrence_state(True, False, now, now) == "paused"
