"""The one percentile definition used by the demo, the benchmarks and the tests.

**Nearest rank**: the p-th percentile of n values is the value at rank ``ceil(p/100 * n)``
(at least 1) in ascending order. It is always one of the measured values, never an
interpolation, so "p99 3 ms" means at least 99% of the values were 3 ms or less and one
value was exactly 3 ms. The median (p50) of an even count is the lower middle value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], p: float) -> float:
    """Nearest-rank ``p``-th percentile (``p`` from 0 to 100) of ``values``, in any order.

    NaN when there are no values (a figure with nothing measured reads "n/a", not 0).
    """
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be between 0 and 100, not {p}")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])
