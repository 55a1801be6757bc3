"""Failure records: one per dead timer, kept whatever later timers with the same id do,
listed by timer id, retried without overwriting a pending timer (issue 9 rows 4, 15, 16)."""

from __future__ import annotations

import json
import time
from typing import Any

import fakeredis
import pytest

from tests.unit.helpers import claim, run
from timers import InvalidTimer, TimerAlreadyPending, Timers
from timers.model.encoding import Record
from timers.model.keys import Keyspace
from timers.model.runs import Outcome, Run, failure_entry, rejected_entry
from timers.ops.failures import FailureOperations
from timers.store.script_calls import ScriptCalls
from timers.store.script_manifest import ScriptName


def finish(scripts: dict[ScriptName, Any], ks: Keyspace, *items: tuple[str, str, str, str]
           ) -> None:
    run(scripts, ScriptCalls(ks).finish(retention_ms=86_400_000, endings=items))


def die(producer: Timers, scripts: dict[ScriptName, Any], ks: Keyspace, tid: str,
        message: str) -> Run:
    """Schedule ``tid`` due now, claim it, and end it as a dead timer as a listener does."""
    producer.schedule("a.b", [message], in_=0, id=tid)
    (claimed,) = claim(scripts, ks).claimed
    run = Run.parse(claimed.token, claimed.run, claimed.source)
    failure_id, record = failure_entry(run, Outcome("error", "E", message), "a.b", [message],
                                       now_ms=round(time.time() * 1000))
    finish(scripts, ks, (run.token, "fail", failure_id, record.to_json()))
    return run


def retry_then_succeed(producer: Timers, scripts: dict[ScriptName, Any], ks: Keyspace,
                       tid: str) -> None:
    producer.schedule("a.b", ["again"], in_=0, id=tid)
    (claimed,) = claim(scripts, ks).claimed
    finish(scripts, ks, (claimed.token, "retry", f"{tid}:a.b;a=1:[\"again\"]", "0"))
    (claimed,) = claim(scripts, ks).claimed
    finish(scripts, ks, (claimed.token, "ok", "", ""))


def test_an_earlier_dead_timers_record_survives_a_later_timer_with_its_id_retrying(
    producer: Timers, scripts: dict[ScriptName, Any], ks: Keyspace
) -> None:
    """Row 16: the retry deleted the record; `failed list` was empty while stats said 1."""
    die(producer, scripts, ks, "order-1", "first death")
    retry_then_succeed(producer, scripts, ks, "order-1")

    (failure,) = producer.failed()
    assert failure.data["message"] == "first death"
    assert producer.stats().failed == 1 == producer.stats().counters["failed"]


def test_every_dead_timer_under_one_id_keeps_its_own_record_and_show_lists_all(
    producer: Timers, scripts: dict[ScriptName, Any], ks: Keyspace
) -> None:
    die(producer, scripts, ks, "x:1", "first")
    die(producer, scripts, ks, "x:1", "second")
    die(producer, scripts, ks, "x:10", "other id")  # shares a prefix, not the id

    assert [f.data["message"] for f in producer.get_failures("x:1")] == ["second", "first"]
    assert producer.get_failure("x:1").data["message"] == "second"  # type: ignore[union-attr]
    assert producer.stats().failed == len(producer.failed()) == 3
    shown = producer.get_failures("x:1")[1]
    assert producer.get_failures(shown.failure_id) == [shown]  # by failure id, as listed


def test_retry_of_a_timer_pending_again_is_skipped_unless_replace(
    producer: Timers, scripts: dict[ScriptName, Any], ks: Keyspace
) -> None:
    """Row 4: `failed retry` overwrote the new pending timer, which was lost."""
    die(producer, scripts, ks, "dup", "old")
    producer.schedule("a.new", ["new"], in_=3600, id="dup")
    failure = producer.get_failure("dup")
    assert failure is not None

    with pytest.raises(TimerAlreadyPending, match="dup is pending again"):
        producer.retry_failure(failure)
    pending = producer.get("dup")
    assert pending is not None and (pending.task, pending.args) == ("a.new", ["new"])
    assert producer.get_failure("dup") == failure  # kept, to retry later

    summary = producer.retry_all_failures()
    assert (summary.retried, summary.pending, summary.not_retryable) == (0, 1, 0)
    assert producer.get("dup").task == "a.new"  # type: ignore[union-attr]

    assert producer.retry_failure(failure, replace=True) == "dup"
    replaced = producer.get("dup")
    assert replaced is not None and (replaced.task, replaced.args) == ("a.b", ["old"])
    assert producer.failed() == []


def test_retry_all_takes_every_record_of_one_instant_past_its_first_page(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    """600 timers refused at one instant (one score, more than a page): the cursor goes on
    by member within the score, so every one is retried, none twice."""
    for i in range(600):
        run = Run(str(i), f"t{i}", f"a.b:[{i}]", due_ms=1000, reruns=0, source="s")
        failure_id, record = failure_entry(run, Outcome("error", "E", "x"), "a.b", [i],
                                           now_ms=1_000_000)
        fake.zadd(ks.failures, {failure_id: 1_000_000})
        fake.hset(ks.failure_records, failure_id, record.to_json())
        fake.zadd(ks.failure_index, {failure_id: 0})

    summary = producer.retry_all_failures()

    assert (summary.retried, summary.pending, summary.not_retryable) == (600, 0, 0)
    assert producer.stats().pending == 600 and producer.stats().failed == 0


def test_retry_all_pages_through_every_record_behind_many_rejected_keys(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    """Row 15: 100 retryable failures behind 500 newer rejected keys: "retrying 0"."""
    for i in range(100):
        run = Run(str(i), f"t{i}", f"a.b:[{i}]", due_ms=1000, reruns=0, source="s")
        failure_id, record = failure_entry(run, Outcome("error", "E", "x"), "a.b", [i],
                                           now_ms=1_000_000 + 1000 * i)
        data = record.to_json()
        fake.zadd(ks.failures, {failure_id: 1_000_000 + i})
        fake.hset(ks.failure_records, failure_id, data)
        fake.zadd(ks.failure_index, {failure_id: 0})
    for i in range(500):
        failure_id, record = rejected_entry(f"timers:bad{i}".encode(), "no such task",
                                            now_ms=round(time.time() * 1000))
        data = record.to_json()
        fake.zadd(ks.failures, {failure_id: 2_000_000 + i})
        fake.hset(ks.failure_records, failure_id, data)
    producer.schedule("a.b", in_=3600, id="t7")  # pending again: skipped

    summary = producer.retry_all_failures()

    assert (summary.retried, summary.pending, summary.not_retryable) == (99, 1, 500)
    assert producer.stats().pending == 100
    assert producer.stats().failed == 501
    assert {f.timer_id for f in producer.failed(1000) if f.timer_id} == {"t7"}


def test_purge_and_forget_keep_the_index_in_step(
    producer: Timers, scripts: dict[ScriptName, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    die(producer, scripts, ks, "a", "x")
    die(producer, scripts, ks, "b", "y")
    producer.retry_failure(producer.get_failure("a"))  # type: ignore[arg-type]
    assert [json.loads(fake.hget(ks.failure_records, i))["id"]  # type: ignore[arg-type]
            for i in fake.zrange(ks.failure_index, 0, -1)] == ["b"]
    assert producer.purge_failures() == 1
    assert fake.zcard(ks.failure_index) == 0 and producer.failed() == []


def plant_failure(fake: fakeredis.FakeRedis, ks: Keyspace, tid: str, record_text: str,
                  options: dict[str, str] | None) -> None:
    """A dead timer's failure record, as a listener writes it for ``record_text``."""
    run = Run("7", tid, record_text, due_ms=1000, reruns=0, source="s")
    failure_id, record = failure_entry(run, Outcome("error", "E", "x"), "a.b", ["cmd"],
                                       now_ms=1_000_000, options=options)
    fake.zadd(ks.failures, {failure_id: 1_000_000})
    fake.hset(ks.failure_records, failure_id, record.to_json())
    fake.zadd(ks.failure_index, {failure_id: 0})


def test_a_retried_dead_timer_keeps_its_group_key_priority_and_max_lateness(
    fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    """An operator's retry from a client of another group put a video node's timer in the
    web group (no listener there could run it) and dropped its concurrency key, so the
    retried command could run beside the device's others."""
    record = Record("a.b", ["cmd"], {"g": "video", "k": "device%3A7", "p": "5", "ml": "30000",
                                     "a": "3"})
    plant_failure(fake, ks, "cmd-1", record.encode(), record.options)

    with Timers(fake, group="web") as web:
        failure = web.get_failure("cmd-1")
        assert failure is not None
        assert web.retry_failure(failure) == "cmd-1"
        pending = web.get("cmd-1")

    assert pending is not None
    assert (pending.group, pending.key, pending.priority) == ("video", "device:7", 5)
    assert pending.attempts == 0  # attempts reset, as before
    stored = Record.decode(fake.hget(ks.records, "cmd-1").decode())  # type: ignore[union-attr]
    assert stored.options.get("ml") == "30000"


def test_a_dead_timer_of_the_default_group_is_retried_there_by_a_client_of_another(
    fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    plant_failure(fake, ks, "plain", Record("a.b", ["cmd"], {}).encode(), None)
    with Timers(fake, group="web") as web:
        assert web.retry_all_failures().retried == 1
        pending = web.get("plain")
    assert pending is not None and pending.group == "default" and pending.key is None


def test_a_failure_record_with_forged_options_is_refused_in_one_line_and_skipped(
    fake: fakeredis.FakeRedis, ks: Keyspace, producer: Timers
) -> None:
    plant_failure(fake, ks, "forged", Record("a.b", [], {}).encode(), {"k": "bad%zz"})
    plant_failure(fake, ks, "fine", Record("a.b", [], {}).encode(), {"p": "2"})

    failure = producer.get_failure("forged")
    assert failure is not None
    with pytest.raises(InvalidTimer, match="forged: its failure record's options do not read"):
        producer.retry_failure(failure)
    summary = producer.retry_all_failures()
    assert (summary.retried, summary.not_retryable) == (1, 1)
    assert producer.get("fine").priority == 2  # type: ignore[union-attr]
    assert producer.get("forged") is None


def test_retry_all_misses_no_record_when_another_process_removes_records_meanwhile(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 old rejected keys (not retryable), then 100 retryable failures; while `timers
    failed retry --all` reads its first page, another process purges 50 of the old
    records (`failed purge`, the retention's trim). Paged by rank, the walk skipped the
    50 retryable records that moved into the ranks it had passed; a cursor misses none."""
    for i in range(500):
        failure_id, record = rejected_entry(f"timers:bad{i}".encode(), "no such task",
                                            now_ms=1_000_000 + i)
        fake.zadd(ks.failures, {failure_id: 1_000_000 + i})
        fake.hset(ks.failure_records, failure_id, record.to_json())
    for i in range(100):
        run = Run(str(i), f"t{i}", f"a.b:[{i}]", due_ms=1000, reruns=0, source="s")
        failure_id, record = failure_entry(run, Outcome("error", "E", "x"), "a.b", [i],
                                           now_ms=2_000_000 + i)
        fake.zadd(ks.failures, {failure_id: 2_000_000 + (i // 10)})  # ties of 10
        fake.hset(ks.failure_records, failure_id, record.to_json())
        fake.zadd(ks.failure_index, {failure_id: 0})
    read = FailureOperations._read_failures
    purged: list[int] = []

    def read_then_purge(self: FailureOperations, ids: Any) -> Any:
        found = yield from read(self, ids)
        if not purged:
            oldest = fake.zrange(ks.failures, 0, 49)
            fake.zrem(ks.failures, *oldest)
            fake.hdel(ks.failure_records, *oldest)
            purged.append(len(oldest))
        return found

    monkeypatch.setattr(FailureOperations, "_read_failures", read_then_purge)
    summary = producer.retry_all_failures()
    assert purged == [50]
    assert (summary.retried, summary.not_retryable) == (100, 500)
    assert producer.stats().pending == 100
