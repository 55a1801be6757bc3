"""DueTracker: how long a listener sleeps before its next claim, on an injected clock."""

from __future__ import annotations

import pytest

from timers.listener.finding.due_tracker import CLAIM_LEAD_MS, OFFSET_MAX_AGE, DueTracker
from timers.model.clock import ManualClock

REDIS_NOW_MS = 1_800_000_000_000.0  # what Redis TIME says at the first sample
LEAD = CLAIM_LEAD_MS / 1000  # the listener claims this many seconds before a due time


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0)


def synced(clock: ManualClock, max_sleep: float = 60.0) -> DueTracker:
    """A tracker that has seen one zero-RTT sample: Redis time == REDIS_NOW_MS now."""
    tracker = DueTracker(clock, max_sleep=max_sleep)
    tracker.observe_time(REDIS_NOW_MS * 1000, clock.now, clock.now)
    return tracker


def test_sleeps_not_at_all_before_it_knows_the_redis_clock(clock: ManualClock) -> None:
    tracker = DueTracker(clock)
    assert not tracker.knows_clock
    assert tracker.seconds_until_next() == 0.0
    tracker.observe_heads(REDIS_NOW_MS + 30_000, None)
    assert tracker.seconds_until_next() == 0.0


def test_sleeps_max_sleep_when_nothing_is_pending(clock: ManualClock) -> None:
    tracker = synced(clock, max_sleep=7.0)
    tracker.observe_heads(None, None)
    assert tracker.seconds_until_next() == 7.0


def test_sleeps_until_the_due_head(clock: ManualClock) -> None:
    tracker = synced(clock)
    tracker.observe_heads(REDIS_NOW_MS + 2_500, None)
    assert tracker.seconds_until_next() == pytest.approx(2.5 - LEAD)

    clock.advance(1.0)
    assert tracker.seconds_until_next() == pytest.approx(1.5 - LEAD)
    clock.advance(1.5 - LEAD - 0.0005)
    assert tracker.seconds_until_next() == pytest.approx(0.0005)
    clock.advance(0.001)
    assert tracker.seconds_until_next() == 0.0  # within the claim lead: claim now
    clock.advance(100)
    assert tracker.seconds_until_next() == 0.0  # overdue never means a negative sleep


def test_sleep_is_capped_by_max_sleep(clock: ManualClock) -> None:
    tracker = synced(clock, max_sleep=5.0)
    tracker.observe_heads(REDIS_NOW_MS + 3_600_000, None)
    assert tracker.seconds_until_next() == 5.0
    clock.advance(3_600 - 2)
    assert tracker.seconds_until_next() == pytest.approx(2.0 - LEAD)


def test_wakes_for_the_earlier_of_due_head_and_lease_head(clock: ManualClock) -> None:
    tracker = synced(clock)
    tracker.observe_heads(REDIS_NOW_MS + 10_000, REDIS_NOW_MS + 4_000)
    assert tracker.next_wake_ms() == REDIS_NOW_MS + 4_000
    assert tracker.seconds_until_next() == pytest.approx(4.0 - LEAD)

    tracker.observe_heads(REDIS_NOW_MS + 3_000, REDIS_NOW_MS + 4_000)
    assert tracker.seconds_until_next() == pytest.approx(3.0 - LEAD)

    tracker.observe_heads(None, REDIS_NOW_MS + 4_000)
    assert tracker.seconds_until_next() == pytest.approx(4.0 - LEAD)


def test_observe_heads_replaces_what_was_known(clock: ManualClock) -> None:
    tracker = synced(clock)
    tracker.observe_heads(REDIS_NOW_MS + 1_000, None)
    tracker.observe_heads(REDIS_NOW_MS + 9_000, None)  # the earlier one was claimed
    assert tracker.seconds_until_next() == pytest.approx(9.0 - LEAD)


def test_note_due_moves_the_wake_earlier_never_later(clock: ManualClock) -> None:
    tracker = synced(clock)
    tracker.observe_heads(REDIS_NOW_MS + 10_000, None)

    tracker.note_due(REDIS_NOW_MS + 2_000)
    assert tracker.next_due_ms == REDIS_NOW_MS + 2_000
    assert tracker.seconds_until_next() == pytest.approx(2.0 - LEAD)

    tracker.note_due(REDIS_NOW_MS + 5_000)
    assert tracker.next_due_ms == REDIS_NOW_MS + 2_000

    tracker.note_due(REDIS_NOW_MS - 50)  # already overdue
    assert tracker.seconds_until_next() == 0.0


def test_note_due_when_nothing_was_pending(clock: ManualClock) -> None:
    tracker = synced(clock, max_sleep=60)
    tracker.observe_heads(None, None)
    tracker.note_due(REDIS_NOW_MS + 1_500)
    assert tracker.seconds_until_next() == pytest.approx(1.5 - LEAD)


def test_offset_uses_the_midpoint_of_the_round_trip(clock: ManualClock) -> None:
    tracker = DueTracker(clock)
    # sent at 1000.000, received at 1000.010: Redis stamped the reply mid-way
    tracker.observe_time(REDIS_NOW_MS * 1000, 1000.000, 1000.010)
    clock.now = 1000.005
    assert tracker.redis_now_ms() == pytest.approx(REDIS_NOW_MS)
    clock.advance(2.0)
    assert tracker.redis_now_ms() == pytest.approx(REDIS_NOW_MS + 2_000)


def test_a_run_starts_when_the_redis_clock_surely_reads_its_due_time(
        clock: ManualClock) -> None:
    """Redis stamped its reply somewhere in the round trip: taking the midpoint, the Redis
    clock may be up to half the round trip behind the estimate, so a run waits that much
    more and never starts before its due time on the Redis clock (whatever the stamp)."""
    tracker = DueTracker(clock)
    tracker.observe_time(REDIS_NOW_MS * 1000, 1000.000, 1000.010)  # rtt 10 ms
    due = REDIS_NOW_MS + 2_000
    at = tracker.monotonic_when_due(due)
    assert at == pytest.approx(tracker.monotonic_at(due) + 0.005)
    # had Redis stamped the reply as it arrived (its clock then as far behind the estimate
    # as it can be), at `at` it reads exactly the due time: never less
    furthest_behind_ms = REDIS_NOW_MS - 1000.010 * 1000
    assert at * 1000 + furthest_behind_ms == pytest.approx(due)


def test_a_sample_with_a_shorter_round_trip_wins(clock: ManualClock) -> None:
    tracker = DueTracker(clock)
    tracker.observe_time(REDIS_NOW_MS * 1000, 1000.000, 1000.020)  # rtt 20 ms, offset A
    precise = (REDIS_NOW_MS + 7) * 1000
    tracker.observe_time(precise, 1001.000, 1001.002)  # rtt 2 ms, 7 ms off A
    clock.now = 1001.001
    assert tracker.redis_now_ms() == pytest.approx(REDIS_NOW_MS + 7)

    # a slower round trip soon after does not replace the precise sample
    tracker.observe_time((REDIS_NOW_MS + 500) * 1000, 1002.000, 1002.050)
    clock.now = 1002.025
    assert tracker.redis_now_ms() == pytest.approx(REDIS_NOW_MS + 7 + 1_024)


def test_an_old_sample_gives_way_to_a_slower_new_one(clock: ManualClock) -> None:
    tracker = DueTracker(clock)
    tracker.observe_time(REDIS_NOW_MS * 1000, 1000.000, 1000.001)  # rtt 1 ms
    later = 1000.001 + OFFSET_MAX_AGE + 1
    drifted = (REDIS_NOW_MS + (later - 1000.0005) * 1000 + 40) * 1000  # Redis 40 ms ahead now
    tracker.observe_time(drifted, later - 0.025, later + 0.025)  # rtt 50 ms
    clock.now = later
    assert tracker.redis_now_ms() == pytest.approx(drifted / 1000)


def test_a_slower_sample_within_max_age_is_ignored(clock: ManualClock) -> None:
    tracker = DueTracker(clock)
    tracker.observe_time(REDIS_NOW_MS * 1000, 1000.000, 1000.001)
    later = 1000.001 + OFFSET_MAX_AGE - 1
    drifted = (REDIS_NOW_MS + (later - 1000.0005) * 1000 + 40) * 1000
    tracker.observe_time(drifted, later - 0.025, later + 0.025)
    clock.now = later
    assert tracker.redis_now_ms() == pytest.approx(drifted / 1000 - 40)


def test_a_listener_sweeps_late_only_at_the_due_times_it_gave_timers_it_handed_back() -> None:
    """Two apps on one prefix each hand the other's timers back: each gives way on the due
    times it chose, so the listener with the task claims first (timers.ops.fleet)."""
    clock = ManualClock()
    tracker = DueTracker(clock)
    tracker.observe_time(1_000_000 * 1000, clock.monotonic(), clock.monotonic())
    now = tracker.redis_now_ms()
    tracker.observe_heads(now + 100, None)
    assert tracker.seconds_until_next() == pytest.approx((100 - CLAIM_LEAD_MS) / 1000)
    tracker.give_way(round(now + 100), 50)
    assert tracker.seconds_until_next() == pytest.approx((150 - CLAIM_LEAD_MS) / 1000)
    tracker.observe_heads(now + 101, None)  # another listener's hand-back: no delay
    assert tracker.seconds_until_next() == pytest.approx((101 - CLAIM_LEAD_MS) / 1000)
