"""Tasks behind flow limits, for the in-memory helper's tests."""

from __future__ import annotations

from tests.unit.sample_tasks.mod import _record
from timers import task


@task(rate="2/m")
def rated(n: int) -> None:
    """At most 2 starts a minute: one every 30 s."""
    _record("rated", n)
