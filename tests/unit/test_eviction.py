"""The listener's judgement of ``maxmemory-policy``: allkeys-* can evict the due index."""

from __future__ import annotations

import logging

import pytest

from timers.exceptions import EvictionUnsafe
from timers.listener.eviction import judge, report_late_finishes


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_allkeys_refuses_unless_allowed(policy: str, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(EvictionUnsafe) as refused:
        judge(policy, allow=False)
    message = str(refused.value)
    assert policy in message and "--allow-eviction" in message and "noeviction" in message
    assert "every pending timer lost" in message
    with caplog.at_level(logging.WARNING, logger="timers"):
        judge(policy, allow=True)
    (warning,) = caplog.records
    assert "every pending timer lost" in warning.getMessage()


@pytest.mark.parametrize("policy", [None, "noeviction", "volatile-lru", "volatile-ttl"])
def test_other_policies_start(policy: str | None) -> None:
    judge(policy, allow=False)


def test_endings_of_runs_gone_from_redis_are_an_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="timers"):
        report_late_finishes(0, "allkeys-lru")
        assert caplog.records == []
        report_late_finishes(3, "allkeys-lru")
        report_late_finishes(1, "noeviction")
    first, second = (r.getMessage() for r in caplog.records)
    assert first.startswith("3 run(s) this listener held were gone from Redis")
    assert "evicted (maxmemory-policy allkeys-lru)" in first
    assert "stalled past its lease" in second and "FLUSHDB" in second
