"""Cancel, reschedule and replace racing a timer's due time, with a listener running.

Each test schedules timers due 3 ms apart and changes each one within a few milliseconds
of its due time (read from Redis ``TIME``), while the listener fires them: some changes
land before the claim and some after (the listener claims timers a few ms ahead of their
due time and starts each on time, so the changes start well before it). Whichever wins,
the outcome the change reports must agree with what the user then sees run, which each
test asserts per timer for both sides. Which side wins each race is up to timing, so each
side is also driven on its own in a ``..._before_the_claim`` and an ``..._after_the_claim``
test: before, the timer is not due yet; after, its task has started (a ``slow.block`` run
waiting for ``test:release``), so the claim certainly happened first.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import (
    KEYS,
    redis_now_ms,
    run_counts,
    runs,
    settled,
    started,
)
from tests.task_pkg.slow import RELEASE
from timers import Fired, Timers, TimerSpec
from timers.model.encoding import escape_id

pytestmark = pytest.mark.integration

COUNT = 200
OFFSETS_MS = (-14, -11, -9, -7, -5, -3, -1, 1)
"""When each change is sent, relative to its timer's due time."""


@pytest.fixture(autouse=True)
def _quick_thread_switches() -> Iterator[None]:
    """Let the racing test thread get the GIL back quickly from the listener's thread.

    At the default 5 ms switch interval a busy in-process listener delays every change the
    test sends by milliseconds, and the changes fall behind the due times they should race.
    """
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    yield
    sys.setswitchinterval(interval)


def _schedule_racing(t: Timers, prefix: str, extra: list[object] | None = None) -> list[str]:
    """COUNT timers due 3 ms apart from 0.1 s on, soonest first; returns their ids."""
    ids = [f"{prefix}{i}" for i in range(COUNT)]
    t.schedule_many(
        TimerSpec("record.hit", [tid, *(extra or [])], in_=0.1 + 0.003 * i, id=tid)
        for i, tid in enumerate(ids)
    )
    return ids


def _at_due(r: redis.Redis, due_ms: int, i: int) -> int:
    """Return once Redis time reaches ``due_ms`` plus the i-th offset; the Redis time then."""
    target = due_ms + OFFSETS_MS[i % len(OFFSETS_MS)]
    while (now := redis_now_ms(r)) < target:
        pass
    return now


def _due_ms(r: redis.Redis, ids: list[str]) -> dict[str, int]:
    scores = r.zmscore(KEYS.due, [escape_id(tid) for tid in ids])
    return {tid: int(score) for tid, score in zip(ids, scores, strict=True)}


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _by_id(reports: list[Fired]) -> dict[str, list[Fired]]:
    out: dict[str, list[Fired]] = defaultdict(list)
    for fired in reports:
        out[fired.timer_id].append(fired)
    return out


def test_cancel_true_means_the_timer_never_runs(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    ids = _schedule_racing(timers_client, "c")
    due = _due_ms(r, ids)
    cancelled = {}
    for i, tid in enumerate(ids[::2]):
        _at_due(r, due[tid], i)
        cancelled[tid] = timers_client.cancel(tid)
    kept = [tid for tid in ids if not cancelled.get(tid)]

    wait_until(lambda: set(run_counts(r)) >= set(kept) and settled(timers_client), 10,
               message="every timer not cancelled to fire")

    counts = run_counts(r)
    fired = _by_id(listener.reports())
    won = [tid for tid, ok in cancelled.items() if ok]
    late = [tid for tid, ok in cancelled.items() if not ok]
    assert {tid: counts[tid] for tid in won} == dict.fromkeys(won, 0), \
        "cancel() returned True but the timer ran"
    assert [tid for tid in won if fired[tid]] == [], "a cancelled timer was reported fired"
    assert {tid: counts[tid] for tid in late} == dict.fromkeys(late, 1), \
        "cancel() returned False but the timer did not run exactly once"
    assert {tid: counts[tid] for tid in kept} == dict.fromkeys(kept, 1)
    assert set(counts) == set(kept)
    assert not any(timers_client.cancel(tid) for tid in ids), "nothing is pending any more"


def test_reschedule_racing_due_time_fires_once_at_the_time_that_won(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    ids = _schedule_racing(timers_client, "s")
    old_due = _due_ms(r, ids)
    new_due: dict[str, int] = {}
    for i, tid in enumerate(ids):
        now = _at_due(r, old_due[tid], i // 2)
        # even: 0.4 s later than now; odd: due at once (earlier than planned)
        target = now + 400 if i % 2 == 0 else now - 1
        if timers_client.reschedule(tid, at=_at(target)):
            new_due[tid] = target

    wait_until(lambda: len(run_counts(r)) == COUNT and settled(timers_client), 10,
               message="every rescheduled timer to fire")

    assert run_counts(r) == Counter({tid: 1 for tid in ids})
    fired = _by_id(listener.reports())
    moved = [tid for tid in ids if tid in new_due]
    too_late = [tid for tid in ids if tid not in new_due]
    assert {tid: [f.due_ms for f in fired[tid]] for tid in moved} == \
        {tid: [new_due[tid]] for tid in moved}, "reschedule() returned True: once, at the new time"
    assert {tid: [f.due_ms for f in fired[tid]] for tid in too_late} == \
        {tid: [old_due[tid]] for tid in too_late}, \
        "reschedule() returned False: once, at the old time"
    later = [tid for i, tid in enumerate(ids) if i % 2 == 0 and tid in new_due]
    assert all(fired[tid][0].started_ms >= old_due[tid] + 200 for tid in later), \
        "a timer moved later fired near its old due time"


def test_reschedule_moves_the_fire_time_both_ways(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    timers_client.schedule("record.hit", ["sooner"], in_=30, id="sooner")
    timers_client.schedule("record.hit", ["later"], in_=0.3, id="later")
    old_sooner = _due_ms(r, ["sooner"])["sooner"]
    assert timers_client.reschedule("sooner", in_=0.3)
    assert timers_client.reschedule("later", in_=1.2)
    new_due = _due_ms(r, ["sooner", "later"])

    wait_until(lambda: run_counts(r) == Counter({"sooner": 1, "later": 1})
               and settled(timers_client), 10, message="both timers to fire")

    fired = _by_id(listener.reports())
    (sooner,), (later,) = fired["sooner"], fired["later"]
    assert sooner.due_ms == new_due["sooner"] and later.due_ms == new_due["later"]
    assert sooner.started_ms < old_sooner - 20_000, "moved 29.7 s earlier, fired at old time"
    assert later.started_ms >= new_due["later"] - 50, "fired before its new due time"
    assert runs(r) == [["sooner"], ["later"]]
    assert not timers_client.reschedule("later", in_=1), "a fired timer is not pending"


def test_replace_racing_due_time_never_runs_one_arg_set_twice(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    """Scheduling again under a pending id replaces that timer: only the new args run. A
    replace that arrives after the old timer was claimed schedules the id afresh (there is
    nothing pending to replace), so then the old args run first and the new ones after."""
    listener = start_listener()
    ids = _schedule_racing(timers_client, "p", ["a"])
    old_due = _due_ms(r, ids)
    for i, tid in enumerate(ids):
        _at_due(r, old_due[tid], i)
        timers_client.schedule("record.hit", [tid, "b"], in_=0.8, id=tid)

    wait_until(lambda: Counter(tag for tag, arg in runs(r) if arg == "b") ==
               Counter({tid: 1 for tid in ids}) and settled(timers_client), 10,
               message="every replacement to fire")

    sequences: dict[str, list[str]] = defaultdict(list)
    for tag, arg in runs(r):
        sequences[tag].append(arg)
    bad = {tid: seq for tid, seq in sequences.items() if seq not in (["b"], ["a", "b"])}
    assert bad == {}, "a timer ran the same args twice, or its old args after its new ones"
    fired = _by_id(listener.reports())
    for tid in ids:
        dues = [f.due_ms for f in fired[tid]]
        if sequences[tid] == ["b"]:  # replaced while pending: the old timer never fired
            assert len(dues) == 1 and dues[0] > old_due[tid], (tid, dues)
        else:  # the claim came first: old args at the old time, then the new timer
            assert len(dues) == 2 and dues[0] == old_due[tid] < dues[1], (tid, dues)


# -- each side of each race, driven on its own ------------------------------------------


def _running(timers_client: Timers, r: redis.Redis, tid: str) -> int:
    """Schedule ``slow.block`` as ``tid`` due now and wait until its task has started: the
    listener has claimed it. Returns the Redis time (ms) once it started."""
    timers_client.schedule("slow.block", [tid], in_=0, id=tid)
    wait_until(lambda: started(r) == [tid], 10, message=f"{tid} to be claimed and start")
    return redis_now_ms(r)


def _release_and_settle(timers_client: Timers, r: redis.Redis, runs_expected: int) -> None:
    r.set(RELEASE, "1")
    wait_until(lambda: len(runs(r)) == runs_expected and settled(timers_client), 10,
               message=f"{runs_expected} run(s) and nothing left pending")


def _sentinel_ran(timers_client: Timers, r: redis.Redis, after_s: float) -> None:
    """Wait for a timer due ``after_s`` from now to run: anything due earlier has had its
    chance to run by then (timers run in due order on one listener)."""
    timers_client.schedule("record.hit", ["sentinel"], in_=after_s, id="sentinel")
    wait_until(lambda: run_counts(r)["sentinel"] == 1 and settled(timers_client), 10,
               message="the sentinel timer to run")


def test_cancel_before_the_claim_returns_true_and_the_timer_never_runs(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    timers_client.schedule("record.hit", ["c"], in_=0.3, id="c")
    assert timers_client.cancel("c") is True
    _sentinel_ran(timers_client, r, 0.4)
    assert run_counts(r) == Counter({"sentinel": 1})
    assert [f.timer_id for f in listener.reports()] == ["sentinel"]


def test_cancel_after_the_claim_returns_false_and_the_timer_runs_once(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    _running(timers_client, r, "c")
    assert timers_client.cancel("c") is False
    _release_and_settle(timers_client, r, 1)
    assert runs(r) == [["c", "released"]]
    assert [f.timer_id for f in listener.reports()] == ["c"]


def test_reschedule_before_the_claim_returns_true_and_fires_once_at_the_new_time(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    timers_client.schedule("record.hit", ["s"], in_=0.2, id="s")
    old_due = _due_ms(r, ["s"])["s"]
    assert timers_client.reschedule("s", in_=0.5) is True
    new_due = _due_ms(r, ["s"])["s"]
    wait_until(lambda: run_counts(r)["s"] == 1 and settled(timers_client), 10,
               message="the rescheduled timer to fire")
    (report,) = listener.reports()
    assert new_due > old_due
    assert report.due_ms == new_due and report.started_ms >= new_due


def test_reschedule_after_the_claim_returns_false_and_the_run_is_the_old_one(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    running_at = _running(timers_client, r, "s")
    assert timers_client.reschedule("s", in_=0.05) is False
    assert timers_client.get("s") is None, "a refused reschedule left a timer pending"
    _release_and_settle(timers_client, r, 1)
    assert runs(r) == [["s", "released"]]
    (report,) = listener.reports()
    assert report.timer_id == "s" and report.due_ms <= running_at, "not the old run"


def test_replace_before_the_claim_runs_only_the_new_args(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    timers_client.schedule("record.hit", ["p", "a"], in_=0.2, id="p")
    timers_client.schedule("record.hit", ["p", "b"], in_=0.3, id="p")
    new_due = _due_ms(r, ["p"])["p"]
    wait_until(lambda: len(runs(r)) == 1 and settled(timers_client), 10,
               message="the replacement to fire")
    assert runs(r) == [["p", "b"]]
    assert [(f.timer_id, f.due_ms) for f in listener.reports()] == [("p", new_due)]


def test_replace_after_the_claim_runs_the_old_then_the_new(
        timers_client: Timers, r: redis.Redis, start_listener) -> None:
    listener = start_listener()
    running_at = _running(timers_client, r, "p")
    timers_client.schedule("record.hit", ["p", "b"], in_=0.05, id="p")
    new_due = _due_ms(r, ["p"])["p"]
    wait_until(lambda: runs(r) == [["p", "b"]], 10,
               message="the new timer to run beside the running old one")
    _release_and_settle(timers_client, r, 2)
    assert runs(r) == [["p", "b"], ["p", "released"]]
    old, new = sorted(f.due_ms for f in listener.reports())
    assert old <= running_at < new == new_due
