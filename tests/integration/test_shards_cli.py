"""The CLI on a sharded prefix (a real server; sharding is a cluster's business, but the
layout, its errors and the views are the same on one server): one line per mistake."""

from __future__ import annotations

import pytest

from tests.integration.helpers import run_cli
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_the_views_merge_the_shards_and_a_wrong_count_is_one_line(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Timers(redis_url, shards=4) as t:
        t.schedule_many(TimerSpec("record.hit", [i], in_=600, id=f"s{i}") for i in range(40))
    stats = run_cli("stats", "--url", redis_url)
    assert stats.returncode == 0 and "pending:  40" in stats.stdout, stats.stdout + stats.stderr
    listed = run_cli("list", "--url", redis_url, "--limit", "100")
    assert all(f"s{i} " in listed.stdout for i in range(40)), listed.stdout

    monkeypatch.setenv("TIMERS_SHARDS", "8")
    for command in (["stats"], ["listen", "--tasks", "tests.task_pkg"]):
        result = run_cli(*command, "--url", redis_url)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == (
            "error: prefix 'timers' is split into 4 shard(s) on this server (fixed when it was "
            "first used); shards=8 (or $TIMERS_SHARDS) asks for another layout"), result.stderr
        assert "Traceback" not in result.stderr
    monkeypatch.setenv("TIMERS_SHARDS", "zero")
    result = run_cli("stats", "--url", redis_url)
    assert result.returncode == 1 and result.stderr.strip() == (
        "error: $TIMERS_SHARDS must be a whole number from 1 to 1024, got 'zero'")
