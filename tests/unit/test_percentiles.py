"""The nearest-rank percentile shared by the demo, the benchmarks and the tests."""

from __future__ import annotations

import math

import pytest

from timers.model.percentiles import percentile


def test_nearest_rank_is_a_measured_value_at_rank_ceil_p_n() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, in any order
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 99.5) == 100.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0


def test_small_samples_take_the_value_at_or_above_the_rank() -> None:
    assert percentile([3.0, 1.0], 50) == 1.0  # the lower middle value, not 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == 5.0
    assert percentile([7.0], 1) == 7.0


def test_no_values_is_nan_and_a_bad_p_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile([1.0], 101)
