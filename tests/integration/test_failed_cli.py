"""`timers failed retry` never overwrites a pending timer and pages through every record;
`failed show` lists every record of an id (issue 9 rows 4, 15, 16)."""

from __future__ import annotations

import pytest
import redis

from tests.integration.helpers import run_cli
from timers import Timers
from timers.model.encoding import escape_id
from timers.model.keys import Keyspace
from timers.model.runs import Outcome, Run, failure_entry, rejected_entry

pytestmark = [pytest.mark.integration, pytest.mark.one_server]
KEYS = Keyspace()


def record_dead(r: redis.Redis, tid: str, token: int, message: str, at_ms: int) -> str:
    """A dead timer's record, as a listener's finish writes it."""
    run = Run(str(token), escape_id(tid), f"a.b:[\"{message}\"]", due_ms=at_ms - 10,
              reruns=0, source="s")
    failure_id, record = failure_entry(run, Outcome("error", "E", message), "a.b", [message],
                                       now_ms=at_ms)
    data = record.to_json()
    r.zadd(KEYS.failures, {failure_id: at_ms})
    r.hset(KEYS.failure_records, failure_id, data)
    r.zadd(KEYS.failure_index, {failure_id: 0})
    return failure_id


def test_failed_retry_skips_a_timer_pending_again_unless_replace(
    timers_client: Timers, r: redis.Redis, redis_url: str
) -> None:
    """Row 4: the new pending timer was overwritten and lost; the old one ran again."""
    record_dead(r, "dup", 1, "old", 1_000_000)
    timers_client.schedule("a.new", ["new"], in_=3600, id="dup")

    one = run_cli("failed", "retry", "dup", "--url", redis_url)
    assert one.returncode == 1
    assert one.stderr.strip() == ("error: timer dup is pending again: not retried "
                                  "(--replace to overwrite it)")
    every = run_cli("failed", "retry", "--all", "--url", redis_url)
    assert every.returncode == 0, every.stderr
    assert every.stdout.strip() == ("retrying 0 timer(s); skipped 1 pending again "
                                    "(--replace to overwrite them)")
    pending = timers_client.get("dup")
    assert pending is not None and pending.task == "a.new"
    assert len(timers_client.failed()) == 1

    forced = run_cli("failed", "retry", "dup", "--replace", "--url", redis_url)
    assert forced.returncode == 0, forced.stderr
    assert timers_client.get("dup").task == "a.b"  # type: ignore[union-attr]
    assert timers_client.failed() == []


def test_failed_retry_all_reaches_failures_behind_500_newer_rejected_keys(
    timers_client: Timers, r: redis.Redis, redis_url: str
) -> None:
    """Row 15: "retrying 0 timer(s)"."""
    for i in range(100):
        record_dead(r, f"t{i}", i, "x", 1_000_000 + i)
    for i in range(500):
        failure_id, record = rejected_entry(f"timers:bad{i}".encode(), "no such task",
                                            now_ms=2_000_000 + i)
        data = record.to_json()
        r.zadd(KEYS.failures, {failure_id: 2_000_000 + i})
        r.hset(KEYS.failure_records, failure_id, data)

    done = run_cli("failed", "retry", "--all", "--url", redis_url)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "retrying 100 timer(s); 500 rejected key(s) left as they are"
    assert timers_client.stats().pending == 100


def test_failed_show_lists_every_dead_timer_of_an_id_with_its_due_time(
    r: redis.Redis, redis_url: str
) -> None:
    """Row 16: a second dead timer under one id overwrote the first."""
    record_dead(r, "job:7", 1, "first death", 1_000_000)
    record_dead(r, "job:7", 2, "second death", 2_000_000)
    shown = run_cli("failed", "show", "job:7", "--url", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("record ") == 2
    assert shown.stdout.index("second death") < shown.stdout.index("first death")
    assert "due:           1970-01-01 00:16:39.990Z" in shown.stdout
    listed = run_cli("failed", "list", "--url", redis_url)
    assert listed.stdout.count("job:7") == 2
