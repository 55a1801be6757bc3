"""A task's own history count (``@task(history_count=N)``) on fakeredis: what a user reads
back (``timers history --task``, ``status(id)``) after a listener ended its timers, a
cancel, and the count changed or removed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest

import timers
from tests.unit.helpers import run_burst
from timers import Timers
from timers.model.history import DEFAULT_HISTORY_AGE, DEFAULT_HISTORY_COUNT, TimerState
from timers.model.keys import Keyspace
from timers.model.policy import policy_of
from timers.store.script_calls import ScriptCalls
from timers.store.script_modes import register_all

PAST = datetime(2001, 1, 1, tzinfo=UTC)
COUNTED = "kept.counted"
"""A task of tests/unit/sample_tasks/kept.py with ``history_count=3``."""


def run_ids(producer: Timers, server: fakeredis.FakeServer, task: str, *ids: str) -> None:
    """Timers ``ids`` of ``task``, due long ago, run by a listener till none is due."""
    producer.schedule_many([{"task": task, "args": [1] if task == "mod.add" else None,
                             "at": PAST, "id": i} for i in ids])
    run_burst(server)


def listed(producer: Timers, task: str) -> set[str]:
    return {r.id for r in producer.history(task=task)}


def task_entries(fake: fakeredis.FakeRedis, ks: Keyspace,
                 *entries: tuple[str, str, str]) -> None:
    """A listener's first finish call, storing its tasks' own ages and counts (task, age ms
    or "", count or "")."""
    call = ScriptCalls(ks).finish(
        retention_ms=1000, endings=[], store_retention=True, task_retention=entries,
        history=(round(DEFAULT_HISTORY_AGE * 1000), DEFAULT_HISTORY_COUNT))
    register_all(fake)["finish"](keys=list(call.keys), args=list(call.args))


def test_a_task_count_keeps_the_newest_of_its_ends_and_no_other_tasks(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    run_ids(producer, server, COUNTED, *(f"c{i}" for i in range(7)))
    run_ids(producer, server, "mod.add", *(f"a{i}" for i in range(5)))
    assert len(listed(producer, COUNTED)) == 3  # of one burst: any three of the seven
    run_ids(producer, server, COUNTED, "c7", "c8", "c9")  # ten runs in all

    assert listed(producer, COUNTED) == {"c7", "c8", "c9"}  # the three newest
    for i in range(7):
        gone = producer.status(f"c{i}")
        assert gone.state is TimerState.UNKNOWN, gone
    assert producer.status("c9").state is TimerState.COMPLETED
    assert listed(producer, "mod.add") == {f"a{i}" for i in range(5)}  # no count: all kept
    assert fake.hlen(ks.history_records) == 3 + 5
    assert fake.zcard(ks.history_task(COUNTED)) == 3
    assert fake.hget(ks.history_task_counts, COUNTED) == b"3"  # for cancel.lua
    assert fake.zcard(ks.history_task("mod.add")) == 5  # its index: all kept
    assert fake.hget(ks.history_task_counts, "mod.add") is None


def test_a_cancel_of_a_counted_task_counts(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    run_ids(producer, server, COUNTED, "c0", "c1", "c2")
    run_ids(producer, server, COUNTED, "c3")  # one more burst: c3 is the newest
    producer.schedule(COUNTED, in_=3600, id="off")
    assert producer.cancel("off")

    assert producer.status("off").state is TimerState.CANCELLED
    kept = listed(producer, COUNTED)
    assert len(kept) == 3 and {"off", "c3"} < kept
    assert fake.zcard(producer.keys.history_task(COUNTED)) == 3


def test_a_newer_end_of_the_id_under_another_task_outlives_the_count(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    run_ids(producer, server, COUNTED, "x")
    run_ids(producer, server, "mod.add", "x")  # the same id ends again, under mod.add
    run_ids(producer, server, COUNTED, "c0", "c1", "c2")  # "x" is popped from the count

    now = producer.status("x")
    assert now.state is TimerState.COMPLETED and now.ended is not None
    assert now.ended.task == "mod.add"
    assert listed(producer, COUNTED) == {"c0", "c1", "c2"}


def test_a_count_changed_applies_at_once_and_one_removed_leaves_the_tasks_index(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    run_ids(producer, server, COUNTED, "c0", "c1", "c2")
    run_ids(producer, server, COUNTED, "c3")
    # the newest end, by the index's scores: each listener's estimate of the Redis clock
    # (a second listener's may read a few ms low on a loaded machine), not the test's order
    (newest,) = (m.decode() for m in fake.zrange(ks.history_task(COUNTED), -1, -1))
    task_entries(fake, ks, (COUNTED, "", "1"))  # redeployed with history_count=1
    assert listed(producer, COUNTED) == {newest}
    assert fake.hget(ks.history_task_counts, COUNTED) == b"1"

    task_entries(fake, ks, (COUNTED, "", ""))  # redeployed without a count
    assert fake.zrange(ks.history_task(COUNTED), 0, -1) == [newest.encode()]  # its index
    assert fake.hget(ks.history_task_counts, COUNTED) is None
    assert listed(producer, COUNTED) == {newest}  # what was kept stays, as any task's
    producer.schedule(COUNTED, in_=3600, id="off")
    assert producer.cancel("off")  # the cancel keeps to no count of its own now
    assert fake.zcard(ks.history_task(COUNTED)) == 2
    assert listed(producer, COUNTED) == {newest, "off"}


def test_a_count_of_zero_keeps_none_of_the_tasks_ends(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    run_ids(producer, server, "kept.uncounted", "z0", "z1")
    producer.schedule("kept.uncounted", in_=3600, id="off")
    assert producer.cancel("off")

    assert listed(producer, "kept.uncounted") == set()
    for timer_id in ("z0", "z1", "off"):
        assert producer.status(timer_id).state is TimerState.UNKNOWN
    assert "kept.uncounted" in producer.tasks_seen()  # its series is kept
    assert fake.hget(ks.history_task_counts, "kept.uncounted") == b"0"
    assert not fake.exists(ks.history_task("kept.uncounted"))


@pytest.mark.parametrize("given", [None, 0, 1, 100_000])
def test_history_count_takes_none_or_a_whole_number(given: int | None) -> None:
    assert policy_of(timers.task(history_count=given)(lambda: None)).history_count == given


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, 10**10, [3]])
def test_a_bad_history_count_fails_at_decoration_with_one_line(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"^history_count must be None or a whole number "
                                         r"from 0 to 1000000000, got ") as e:
        timers.task(history_count=bad)
    assert "\n" not in str(e.value) and e.value.__cause__ is None
