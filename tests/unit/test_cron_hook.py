"""What a listener does around an occurrence (:class:`RecurrenceHook`), on fakeredis.

Occurrences are claimed with the claim script as a listener claims them (with a horizon,
so occurrences due tomorrow can be taken today), and the hook is called with an injected
start time: catch-up after days of downtime is tested without waiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest

from tests.unit.helpers import claim
from tests.unit.test_cron_producer import pending
from timers import Timers
from timers.exceptions import MalformedTimerKey
from timers.listener.cron_hook import RecurrenceHook
from timers.model.cron import State
from timers.model.encoding import Record, escape_id
from timers.model.keys import Keyspace
from timers.model.runs import OK, Outcome, Run
from timers.store.script_modes import register_all

KS = Keyspace()
DAY = 86_400_000
HORIZON = 10 * DAY


class Listener:
    """One listener's hook on its own event loop, driven step by step."""

    def __init__(self, server: fakeredis.FakeServer) -> None:
        self.runner = asyncio.Runner()
        self.client = fakeredis.FakeAsyncRedis(server=server)
        self.hook = RecurrenceHook(self.client, KS)

    def before(self, run: Run, started_ms: float | None = None) -> Outcome | None:
        started = run.due_ms + 1 if started_ms is None else started_ms
        return self.runner.run(self.hook.before_run(run, run.record(), started))

    def after(self, run: Run, outcome: Outcome = OK) -> None:
        self.runner.run(self.hook.after_run(run, run.record(), outcome))

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.close()


@pytest.fixture
def t(fake: fakeredis.FakeRedis) -> Iterator[Timers]:
    with Timers(fake) as client:
        yield client


@pytest.fixture
def listeners(server: fakeredis.FakeServer) -> Iterator[list[Listener]]:
    made = [Listener(server), Listener(server)]
    yield made
    for listener in made:
        listener.close()


def take(fake: fakeredis.FakeRedis, horizon_ms: int = HORIZON) -> Run:
    """Claim the next pending timer as a listener would."""
    [c] = claim(register_all(fake), KS, limit=1, horizon_ms=horizon_ms).claimed
    return Run.parse(c.token, c.run, c.source)


def pending_dues(fake: fakeredis.FakeRedis, name: str) -> list[int]:
    return sorted(due for timer_id, (due, _) in pending(fake).items()
                  if timer_id.rpartition("@")[0] == name)


def state(fake: fakeredis.FakeRedis, name: str) -> State:
    return State.decode(fake.hget(KS.recurrence_states, escape_id(name)))


# -- the next occurrence, scheduled once -------------------------------------------------


def test_the_claim_of_an_occurrence_schedules_the_next_one(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("daily", "mod.add", [1], cron="0 9 * * *", tz="Europe/Berlin")
    run = take(fake)
    assert pending(fake) == {}
    assert listeners[0].before(run) is None  # runs
    assert pending_dues(fake, "daily") == [run.due_ms + DAY]
    assert (state(fake, "daily").last, state(fake, "daily").prev) == (run.due_ms + DAY,
                                                                       run.due_ms)


def test_a_rerun_or_a_second_listener_schedules_nothing_more(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("daily", "mod.add", cron="0 9 * * *")
    run = take(fake)
    assert listeners[0].before(run) is None
    assert listeners[1].before(run) is None  # the same occurrence again (after a crash)
    crashed = Run(run.token + "0", run.escaped_id, run.record_text, run.due_ms, 1, "recovered")
    assert listeners[1].before(crashed) is None
    assert pending_dues(fake, "daily") == [run.due_ms + DAY]


def test_racing_listeners_schedule_the_next_occurrence_once(
    t: Timers, fake: fakeredis.FakeRedis, server: fakeredis.FakeServer
) -> None:
    t.every("tick", "mod.add", interval=60)
    run = take(fake)

    async def race() -> list[Outcome | None]:
        clients = [fakeredis.FakeAsyncRedis(server=server) for _ in range(8)]
        hooks = [RecurrenceHook(c, KS) for c in clients]
        try:
            return list(await asyncio.gather(*(h.before_run(run, run.record(), run.due_ms)
                                               for h in hooks)))
        finally:
            for c in clients:
                await c.aclose()

    assert asyncio.run(race()) == [None] * 8
    assert pending_dues(fake, "tick") == [run.due_ms + 60_000]


def test_the_chain_goes_on_occurrence_after_occurrence(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    rec = t.every("tick", "mod.add", interval=timedelta(seconds=1))
    assert rec.next_due is not None
    dues = []
    for i in range(20):
        run = take(fake)
        dues.append(run.due_ms)
        assert listeners[i % 2].before(run) is None
    first = int(rec.next_due.timestamp() * 1000)
    assert dues == [first + 1000 * k for k in range(20)]


# -- changes while an occurrence is in flight --------------------------------------------


def test_an_occurrence_claimed_before_a_change_runs_but_schedules_nothing(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("daily", "mod.add", [1], cron="0 9 * * *")
    run = take(fake)
    changed = t.every("daily", "mod.add", [2], cron="0 10 * * *")
    assert changed.next_due is not None
    assert listeners[0].before(run) is None  # due under the definition it was made for
    assert pending_dues(fake, "daily") == [int(changed.next_due.timestamp() * 1000)]


def test_an_occurrence_claimed_before_a_pause_or_removal_is_skipped(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("a", "mod.add", cron="0 9 * * *")
    run = take(fake)
    t.pause("a")
    outcome = listeners[0].before(run)
    assert outcome is not None and outcome.kind == "skipped" and "paused" in outcome.message
    assert pending(fake) == {}
    t.resume("a")
    assert len(pending_dues(fake, "a")) == 1
    t.unschedule_recurring("a")
    outcome = listeners[0].before(run)
    assert outcome is not None and outcome.kind == "skipped" and "removed" in outcome.message
    assert pending(fake) == {}


def test_a_broken_recurrence_option_is_malformed(
    fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    record = Record("mod.add", None, {"r": "%FF", "v": "1"}).encode()
    run = Run("1", "x@1", record, 1, 0, "sweep")
    with pytest.raises(MalformedTimerKey):
        listeners[0].before(run)


# -- catch-up after downtime (injected start times) --------------------------------------


def down_for_three_days(t: Timers, fake: fakeredis.FakeRedis, catch_up: str,
                        max_lateness: float | None = None) -> tuple[Run, int]:
    t.every("daily", "mod.add", cron="0 9 * * *", tz="Europe/Berlin",
            catch_up=catch_up,  # type: ignore[arg-type]
            max_lateness=max_lateness)
    run = take(fake)
    return run, run.due_ms + 3 * DAY + 3_600_000  # every listener came back at 10:00


def test_catch_up_latest_runs_once_for_the_latest_missed(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    run, now = down_for_three_days(t, fake, "latest")
    outcome = listeners[0].before(run, now)
    assert outcome is not None and outcome.kind == "skipped"
    latest = run.due_ms + 3 * DAY
    assert pending_dues(fake, "daily") == [latest]
    caught_up = take(fake)
    assert caught_up.due_ms == latest
    assert listeners[1].before(caught_up, now + 5) is None  # runs
    assert pending_dues(fake, "daily") == [latest + DAY]


def test_catch_up_all_runs_each_missed_occurrence_in_order(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    run, now = down_for_three_days(t, fake, "all")
    ran = []
    while True:
        assert listeners[0].before(run, now) is None
        ran.append(run.due_ms)
        # the next missed one is scheduled only when this run has ended
        if run.due_ms + DAY <= now:
            assert pending(fake) == {}
        listeners[0].after(run)
        run = take(fake)
        if run.due_ms > now:
            break
        now += 1000
    assert ran == [ran[0] + k * DAY for k in range(4)]


def test_catch_up_none_skips_what_was_missed(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    run, now = down_for_three_days(t, fake, "none")
    outcome = listeners[0].before(run, now)
    assert outcome is not None and outcome.kind == "skipped" and "none" in outcome.message
    assert pending_dues(fake, "daily") == [run.due_ms + 4 * DAY]


STEP = 200


def back_after_five_missed(t: Timers, fake: fakeredis.FakeRedis, catch_up: str) -> (
        tuple[Run, int]):
    """A 200 ms recurrence whose listeners were all down while five occurrences came due:
    its first occurrence, and the start time of the listener that claims it when back."""
    t.every("late", "mod.add", interval=STEP / 1000,
            catch_up=catch_up)  # type: ignore[arg-type]
    run = take(fake)
    return run, run.due_ms + 4 * STEP + 100


def test_latest_after_downtime_skips_the_first_and_runs_the_latest_then_goes_on(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    first, back = back_after_five_missed(t, fake, "latest")
    outcome = listeners[0].before(first, back)
    assert outcome is not None and outcome.kind == "skipped"
    latest = take(fake)
    assert latest.due_ms == first.due_ms + 4 * STEP  # the latest one missed while down
    assert listeners[0].before(latest, back + 1) is None
    assert pending_dues(fake, "late") == [latest.due_ms + STEP]


def test_all_after_downtime_runs_each_missed_one_in_order_one_after_the_other(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    run, now = back_after_five_missed(t, fake, "all")
    first, ran = run.due_ms, []
    while run.due_ms <= now:
        assert listeners[0].before(run, now) is None
        ran.append(run.due_ms)
        if run.due_ms + STEP <= now:
            assert pending(fake) == {}, "the next missed one waits for this run to end"
        listeners[0].after(run)
        run, now = take(fake), now + 5
    assert ran == [first + k * STEP for k in range(5)]
    assert run.due_ms == first + 5 * STEP  # then the chain goes on on time


def test_none_after_downtime_skips_what_was_missed_and_goes_on_after_now(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    first, back = back_after_five_missed(t, fake, "none")
    outcome = listeners[0].before(first, back)
    assert outcome is not None and outcome.kind == "skipped" and "none" in outcome.message
    [following] = pending_dues(fake, "late")
    assert back < following <= back + STEP
    assert following == first.due_ms + 5 * STEP


def test_max_lateness_skips_but_keeps_the_chain(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("tick", "mod.add", interval=60, max_lateness=5)
    run = take(fake)
    outcome = listeners[0].before(run, run.due_ms + 5_001)
    assert outcome is not None and "max lateness" in outcome.message
    assert pending_dues(fake, "tick") == [run.due_ms + 60_000]


# -- overlap -----------------------------------------------------------------------------


def test_without_overlap_an_occurrence_is_skipped_while_the_previous_run_holds_on(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("slow", "mod.add", interval=60, overlap=False)
    first = take(fake)
    assert listeners[0].before(first) is None
    assert state(fake, "slow").run == first.token
    second = take(fake)
    outcome = listeners[1].before(second)
    assert outcome is not None and outcome.kind == "skipped"
    assert first.token in outcome.message and "overlap" in outcome.message
    assert pending_dues(fake, "slow") == [second.due_ms + 60_000]  # the chain goes on
    listeners[0].after(first)
    assert state(fake, "slow").run == ""
    third = take(fake)
    assert listeners[1].before(third) is None
    assert state(fake, "slow").run == third.token


def test_a_lapsed_lease_does_not_block_the_next_run(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("slow", "mod.add", interval=60, overlap=False)
    first = take(fake)
    assert listeners[0].before(first) is None
    fake.zadd(KS.running, {first.token: 0}, xx=True)  # its listener died
    second = take(fake, horizon_ms=HORIZON)
    # the claim recovered the lapsed run first; take the occurrence itself
    if second.timer_id == first.timer_id:
        second = take(fake)
    assert listeners[1].before(second) is None
    assert state(fake, "slow").run == second.token


def test_overlap_allowed_by_default_keeps_no_slot(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("fast", "mod.add", interval=60)
    first = take(fake)
    assert listeners[0].before(first) is None
    assert listeners[1].before(take(fake)) is None
    assert state(fake, "fast").run == ""


def test_a_skipped_occurrence_does_not_release_the_slot_it_never_held(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("slow", "mod.add", interval=60, overlap=False)
    first = take(fake)
    listeners[0].before(first)
    second = take(fake)
    skipped = listeners[1].before(second)
    assert skipped is not None
    listeners[1].after(second, skipped)
    assert state(fake, "slow").run == first.token


def test_after_run_outlives_a_failing_release(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    t.every("slow", "mod.add", interval=60, overlap=False)
    first = take(fake)
    listener = listeners[0]
    listener.before(first)
    calls = redis_gone(listener, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        listener.after(first)  # logged, not raised: the slot frees itself with the lease
    assert calls == [1] * RecurrenceHook.AFTER_ATTEMPTS
    assert "could not release the overlap slot of slow: gone" in caplog.text


def test_after_run_that_cannot_schedule_the_next_occurrence_raises_so_its_run_comes_back(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A missed occurrence of ``catch_up="all"`` runs, and its next is scheduled as it
    ends: if Redis stays away through every attempt, the step raises (the executor hands
    the run back, and its rerun schedules the next), never ends the chain in silence."""
    t.every("tick", "mod.add", interval=60, catch_up="all")
    first = take(fake)
    listener = listeners[0]
    assert listener.before(first, first.due_ms + 120_000) is None  # the next is due too
    assert pending_dues(fake, "tick") == [], "the next waits for this run's end"
    calls = redis_gone(listener, monkeypatch)
    with pytest.raises(ConnectionError):
        listener.after(first)
    assert calls == [1] * RecurrenceHook.AFTER_ATTEMPTS


async def _no_sleep(_: float) -> None:
    return None


def redis_gone(listener: Listener, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every step ``listener``'s hook sends fails as if Redis were gone, at once (no
    backoff): the list of those calls, one 1 each."""
    calls: list[int] = []

    async def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise ConnectionError("gone")

    monkeypatch.setattr(listener.hook.scripts, "cron_next", broken)
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    return calls


def test_now_is_the_injected_start_time_not_the_wall_clock(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    t.every("tick", "mod.add", interval=60, catch_up="none")
    run = take(fake)
    far = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000)
    outcome = listeners[0].before(run, far)
    assert outcome is not None and outcome.kind == "skipped"
    [due] = pending_dues(fake, "tick")
    assert far < due <= far + 60_000


def test_a_missed_occurrence_skipped_for_overlap_still_schedules_the_next_one(
    t: Timers, fake: fakeredis.FakeRedis, listeners: list[Listener]
) -> None:
    """catch_up="all" would schedule the next one when this run ends; a run that does not
    go ahead because the previous one still runs must schedule it at once instead."""
    t.every("daily", "mod.add", cron="0 9 * * *", catch_up="all", overlap=False)
    first = take(fake)
    now = first.due_ms + 3 * DAY + 60_000
    assert listeners[0].before(first, now) is None  # runs; the next waits for its end
    assert pending(fake) == {}
    # the same occurrence again (a second claim after a hand-back) while the first holds on
    again = Run(first.token + "9", first.escaped_id, first.record_text, first.due_ms, 0,
                "sweep")
    fake.zadd(KS.running, {again.token: now + 60_000})
    outcome = listeners[1].before(again, now)
    assert outcome is not None and "overlap" in outcome.message
    assert pending_dues(fake, "daily") == [first.due_ms + DAY]
    listeners[0].after(first)  # its deferred scheduling finds the next one scheduled
    assert pending_dues(fake, "daily") == [first.due_ms + DAY]
