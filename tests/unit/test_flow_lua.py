"""Every flow-control decision of the Lua scripts (fakeredis + lupa): which groups a claim
takes, priority among due timers, concurrency-key slots (wait, promote, lease lapse,
cancel) and rate limits (spacing, the pacer, order)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import fakeredis
import pytest

from tests.unit.flow_helpers import KS, LEASE, add, claim, finish, gate, ids, s
from tests.unit.model_flow import VirtualClock, redis_clock
from timers.model.runs import Run
from timers.store.script_rows import GateRun, Taker
from timers.store.scripts import Scripts

__all__ = ["s"]  # the fixture

# -- groups and priority --------------------------------------------------------------


def test_a_claim_takes_only_the_groups_it_serves(s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "web", "mail.send:")
    add(s, "vid", "video.encode;g=video:")
    assert ids(claim(s)) == ["web"]
    assert fake.zscore(KS.due_index("video"), "vid") is not None  # pending, untouched
    assert ids(claim(s, groups=("video",))) == ["vid"]
    assert fake.zcard(KS.running_of("video")) == 1 and fake.zcard(KS.running) == 1


def test_an_event_named_timer_of_another_group_is_not_claimed(s: Scripts) -> None:
    add(s, "vid", "video.encode;g=video:")
    reply = s.claim(limit=5, lease_ms=LEASE, horizon_ms=0, listener_id="me",
                    event_ids=["vid"], groups=("default",))
    assert reply[3:] == []


def test_higher_priority_is_claimed_first_and_equal_priority_keeps_due_order(
        s: Scripts) -> None:
    add(s, "low-early", "t.f:", -500)
    add(s, "low-late", "t.f:", -100)
    add(s, "high-late", "t.f;p=5:", -1)
    add(s, "neg", "t.f;p=-3:", -900)
    assert ids(claim(s, limit=1)) == ["high-late"]
    assert ids(claim(s, limit=10)) == ["low-early", "low-late", "neg"]


def test_lapsed_runs_are_recovered_only_by_their_groups_listeners(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "vid", "video.encode;g=video:")
    [run] = claim(s, groups=("video",))
    fake.zadd(KS.running_of("video"), {run.token: 0})  # its lease lapsed: its listener died
    assert claim(s) == []
    [rerun] = claim(s, groups=("video",))
    assert (rerun.timer_id, rerun.reruns) == ("vid", 1)


def test_a_moved_timer_goes_to_its_tasks_group(s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "x", "video.encode:")
    [run] = claim(s)
    s.finish(retention_ms=1000, endings=[(run.token, "move", "x:video.encode;g=video:",
                                          str(run.due_ms))])
    assert fake.zscore(KS.due_index("video"), "x") == run.due_ms
    assert ids(claim(s, groups=("video",))) == ["x"]
    assert fake.hget(KS.stats, "routed") == b"1"


# -- concurrency keys ------------------------------------------------------------------


def one_holds_one_waits(s: Scripts, key: str = "k") -> tuple[Run, Run]:
    """Runs of timers "a" and "b", "a" holding ``key``'s one slot, "b" waiting for it."""
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)
    a, b = claim(s)
    assert gate(s, [a, b], key=key, limit=1) == ["go", "wait"]
    return a, b


def test_a_full_key_holds_the_timer_back_and_a_freed_slot_lets_it_go(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    first, second = one_holds_one_waits(s, "dev:7")
    assert fake.zcard(KS.running) == 1  # b is no longer running
    assert fake.hget(KS.records, "b") is not None  # still pending: cancel and get see it
    assert fake.zrange(KS.key_queue("dev:7"), 0, -1) == [b"b"]
    assert claim(s) == []  # waiting is not polled: it is in no due index
    finish(s, first)
    [again] = claim(s)  # promoted at once, with a slot kept for it
    assert again.timer_id == "b" and again.waited_from_ms == second.due_ms
    assert gate(s, [again], key="dev:7", limit=1) == ["go"]
    assert fake.hget(KS.stats, "waited") == b"1"


def test_waiting_timers_go_by_priority_then_due_time(s: Scripts) -> None:
    for i, record in enumerate(["t.f:", "t.f:", "t.f;p=9:", "t.f:"]):
        add(s, f"t{i}", record, -100 + i)
    runs = claim(s)
    holder = next(r for r in runs if r.timer_id == "t2")  # high priority: claimed first
    assert gate(s, runs, key="k", limit=1) == ["go", "wait", "wait", "wait"]
    order = []
    for _ in range(3):
        finish(s, holder)
        [holder] = claim(s)
        assert gate(s, [holder], key="k", limit=1) == ["go"]
        order.append(holder.timer_id)
    assert order == ["t0", "t1", "t3"]


def test_a_lapsed_run_holds_its_slot_until_recovered_and_its_rerun_goes_first(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    [a] = claim(s)
    assert gate(s, [a], key="k", limit=1) == ["go"]
    add(s, "b", "t.f:", -10)
    [b] = claim(s)
    assert gate(s, [b], key="k", limit=1) == ["wait"]
    # its listener stopped renewing (dead, or paused past its lease): the lapsed run
    # still counts, so nothing else of the key starts while it may still be running
    fake.zadd(KS.slots("k"), {a.token: 0})
    add(s, "c", "t.f:", -5)
    [c] = claim(s)  # (a's own lease has not lapsed yet: this claim recovers nothing)
    assert gate(s, [c], key="k", limit=1) == ["wait"]
    fake.zadd(KS.running, {a.token: 0})
    [rerun] = claim(s)  # recovered: the rerun takes the cut run's slot over
    assert (rerun.timer_id, rerun.reruns) == ("a", 1)
    assert fake.zscore(KS.slots("k"), rerun.token) is not None
    assert fake.zscore(KS.slots("k"), a.token) is None
    assert gate(s, [rerun], key="k", limit=1) == ["go"]
    finish(s, rerun)
    assert ids(claim(s)) == ["b"]  # then the key's queue, in order


def test_a_run_handed_back_with_a_grace_keeps_its_slot_for_its_timer(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    # a listener stopping hands back a run whose task may still be going in its thread
    # until the process exits: the key must start nothing meanwhile, then that timer first
    a, _ = one_holds_one_waits(s)
    s.finish(retention_ms=1000, endings=[(a.token, "release", "1000", "")])
    seconds, micros = fake.time()
    now_ms = seconds * 1000 + micros // 1000
    [(holder, until)] = fake.zrange(KS.slots("k"), 0, -1, withscores=True)
    assert holder == b"w:a" and now_ms + 900 + LEASE < until <= now_ms + 1000 + LEASE
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"b"]  # b still waits
    assert claim(s) == []  # a comes due again at the grace's end, not before
    assert now_ms + 900 < fake.zscore(KS.due, "a") <= now_ms + 1000
    assert b";w=" + str(a.due_ms).encode() in fake.hget(KS.records, "a")  # lateness kept
    fake.zadd(KS.due, {"a": 0})  # the grace is over (as if 1 s went by)
    [again] = claim(s)
    assert (again.timer_id, again.waited_from_ms) == ("a", a.due_ms)
    assert gate(s, [again], key="k", limit=1) == ["go"]  # its slot, before b
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"b"]


def test_a_grace_slot_left_to_lapse_lets_the_key_go_on(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _ = one_holds_one_waits(s)
    s.finish(retention_ms=1000, endings=[(a.token, "release", "1000", "")])
    fake.zrem(KS.slots("k"), "w:a")  # kept past its time: lapsed, cleared by a gate
    fake.zadd(KS.due, {"a": 0})
    [again] = claim(s)
    # the key is free and a waits ahead of b (due first): it goes, b waits on
    assert gate(s, [again], key="k", limit=1) == ["go"]
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"b"]


def test_a_run_without_a_key_handed_back_with_a_grace_is_due_again_at_once(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    [a] = claim(s)
    s.finish(retention_ms=1000, endings=[(a.token, "release", "1000", "")])
    assert fake.zscore(KS.due, "a") == a.due_ms  # its old due time: runs again at once
    assert ids(claim(s)) == ["a"]


def test_a_grace_keeps_no_slot_for_a_timer_scheduled_again_meanwhile(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _ = one_holds_one_waits(s)
    add(s, "a", "t.f:", 60_000)  # the same id, scheduled again while its run went on
    s.finish(retention_ms=1000, endings=[(a.token, "release", "1000", "")])
    assert fake.hget(KS.parked, "a") is None  # the newer timer waits for nothing
    assert fake.zrange(KS.slots("k"), 0, -1) == [b"w:b"]  # freed: kept for the next in line


def test_a_release_grace_that_is_not_a_count_is_refused(s: Scripts) -> None:
    add(s, "a", "t.f:", -20)
    [a] = claim(s)
    with pytest.raises(Exception, match="bad ending 1"):
        s.finish(retention_ms=1000, endings=[(a.token, "release", "soon", "")])


def test_a_recovered_run_passes_its_slot_to_its_rerun_not_to_the_next_waiting(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)
    a, b = claim(s)
    assert gate(s, [a, b], key="k", limit=1) == ["go", "wait"]
    fake.zadd(KS.running, {a.token: 0})  # a's listener died
    [rerun] = claim(s)  # b still waits: the rerun of the cut command goes first
    assert rerun.timer_id == "a"
    assert fake.hget(KS.held, a.token) is None
    assert fake.hget(KS.held, rerun.token) is not None


def test_renewing_a_run_renews_its_slot(s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a")
    [a] = claim(s)
    gate(s, [a], key="k", limit=1)
    fake.zadd(KS.slots("k"), {a.token: 5})
    assert s.renew(LEASE, [a.token]) == []
    score = fake.zscore(KS.slots("k"), a.token)
    assert score is not None and score > 5


def test_cancelling_a_waiting_timer_takes_it_out_of_its_queue(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)
    a, b = claim(s)
    gate(s, [a, b], key="k", limit=1)
    assert s.cancel("b") == 1
    assert fake.zcard(KS.key_queue("k")) == 0 and fake.hget(KS.parked, "b") is None
    finish(s, a)
    assert claim(s) == []


def promote_t1(s: Scripts) -> None:
    """Timers t0 to t2 of key "k" (limit 1): t0 ran, t1 is promoted (its slot kept), t2
    waits."""
    for i in range(3):
        add(s, f"t{i}", "t.f:", -30 + i)
    a, b, c = claim(s)
    gate(s, [a, b, c], key="k", limit=1)
    finish(s, a)


def test_cancelling_a_promoted_timer_passes_its_slot_on(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    promote_t1(s)
    assert s.cancel("t1") == 1
    [next_] = claim(s)
    assert next_.timer_id == "t2" and gate(s, [next_], key="k", limit=1) == ["go"]


ENDED_UNGATED = {
    "ok": ("ok", "", ""),  # ended the same way as the run a dead process had finished
    "dead": ("fail", "{id}:{token}", "{{}}"),  # missed its max lateness, task refused
    "retry": ("retry", "{id}:t.f;a=1:", "60000"),
}


@pytest.mark.parametrize("kind", sorted(ENDED_UNGATED))
def test_a_promoted_timer_ended_before_its_gate_lets_its_keys_next_timer_go(
        s: Scripts, fake: fakeredis.FakeRedis, kind: str) -> None:
    promote_t1(s)  # the key's one slot kept for t1
    [b_run] = claim(s)
    assert b_run.timer_id == "t1"
    how, first, second = ENDED_UNGATED[kind]
    s.finish(retention_ms=1000, endings=[(
        b_run.token, how, first.format(id="t1", token=b_run.token), second)])
    assert fake.hget(KS.parked, "t1") is None
    [c_run] = claim(s)  # before: nothing, ever (the kept slot held the key)
    assert c_run.timer_id == "t2" and gate(s, [c_run], key="k", limit=1) == ["go"]


def test_a_pacer_ended_before_its_gate_hands_its_rates_next_slot_on(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    for i in range(3):
        add(s, f"t{i}", "t.f:", -40 + i)
    gate(s, claim(s), rate="r", interval_ms=1, burst=1)
    clock.ms = slot_of(fake, "t1")
    [pacer] = claim(s)
    finish(s, pacer)  # ended the same way as a run a dead process had finished
    assert fake.hget(KS.rate("r"), "pacer") in (None, b"t2")
    clock.ms += 10
    [after] = claim(s)  # before: the rate's queue waited for a pacer that had ended
    assert after.timer_id == "t2" and gate(s, [after], rate="r", interval_ms=1,
                                           burst=1) == ["go"]


def test_an_ending_before_its_gate_leaves_a_newer_timer_of_its_id_its_kept_slot(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    promote_t1(s)
    [b_run] = claim(s)
    add(s, "t1", "t.f:", -1)  # scheduled again while its run is claimed
    finish(s, b_run)
    assert fake.zscore(KS.slots("k"), "w:t1") is not None  # nothing of the new t1 touched


def test_a_gate_for_a_run_whose_id_was_scheduled_again_drops_it(s: Scripts) -> None:
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)
    a, b = claim(s)
    add(s, "b", "t.g:", 60_000)  # scheduled again while b's run was claimed
    assert gate(s, [a, b], key="k", limit=1) == ["go", "replaced"]


def test_a_gate_for_a_lost_lease_changes_nothing(s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a")
    [a] = claim(s)
    fake.zrem(KS.running, a.token)
    assert gate(s, [a], key="k", limit=1) == ["lost"]
    assert fake.zcard(KS.slots("k")) == 0


# -- rate limits ------------------------------------------------------------------------


@pytest.fixture
def clock() -> Iterator[VirtualClock]:
    """The Redis clock of fakeredis, moved on by the test (a rate slot's time comes)."""
    virtual = VirtualClock()
    with redis_clock(virtual):
        yield virtual


def slot_of(fake: fakeredis.FakeRedis, timer_id: str) -> int:
    """The due time of ``timer_id`` in the default due index: a pacer's rate slot."""
    slot = fake.zscore(KS.due_index(), timer_id)
    assert slot is not None
    return int(slot)


def test_a_rate_limit_spaces_starts_and_queues_the_rest_in_order(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    for i in range(4):
        add(s, f"t{i}", "t.f:", -40 + i)
    runs = claim(s)
    assert gate(s, runs, rate="r", interval_ms=1000, burst=1) == ["go", "wait", "wait", "wait"]
    pacer = fake.zrange(KS.due, 0, -1, withscores=True)
    assert [m for m, _ in pacer] == [b"t1"]  # the head holds the next slot, one second on
    now = runs[0].due_ms + 40
    assert now + 900 <= pacer[0][1] <= now + 1100 + 1000
    assert fake.zrange(KS.rate_queue("r"), 0, -1) == [b"t2", b"t3"]
    assert fake.hget(KS.stats, "rate_limited") == b"3"


def test_the_pacer_goes_and_hands_the_next_slot_on(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    for i in range(3):
        add(s, f"t{i}", "t.f:", -40 + i)
    runs = claim(s)
    gate(s, runs, rate="r", interval_ms=1, burst=1)
    clock.ms = slot_of(fake, "t1")  # its slot time has come
    [pacer] = claim(s)
    assert pacer.timer_id == "t1" and pacer.waited_from_ms == runs[1].due_ms
    assert gate(s, [pacer], rate="r", interval_ms=1, burst=1) == ["go"]
    assert [m for m in fake.zrange(KS.due, 0, -1)] == [b"t2"]


def test_a_late_run_asking_again_moves_its_rates_slots_on_by_its_lateness(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    """T29: the pacer goes, and the next pacer takes its slot; the first reached its call
    30 ms late and asks again: it goes, the next pacer's slot and the rate's tat move 30 ms
    on, and its wait is not counted twice. Once another start was let go, a second ask
    finds the rate's last start not its own and waits for the rate."""
    for i in range(3):
        add(s, f"t{i}", "t.f:", -40 + i)
    gate(s, claim(s), rate="r", interval_ms=100, burst=1)  # t0 goes, t1 paces, t2 waits
    clock.ms = slot_of(fake, "t1")
    [pacer] = claim(s)
    assert gate(s, [pacer], rate="r", interval_ms=100, burst=1) == ["go"]  # t2 paces now

    def next_slot() -> tuple[int, int]:
        parked = fake.hget(KS.parked, "t2")
        tat = fake.hget(KS.rate("r"), "tat")
        assert parked is not None and tat is not None
        return int(parked.decode().split("|")[3]), int(tat)

    slot, tat = next_slot()
    held = fake.hget(KS.stats, "held_ms")
    clock.ms += 30
    assert gate(s, [pacer], rate="r", interval_ms=100, burst=1) == ["go"]
    assert next_slot() == (slot + 30, tat + 30)
    assert fake.hget(KS.stats, "held_ms") == held
    add(s, "t3", "t.f:", -10)
    clock.ms = slot + 30
    [t2] = [r for r in claim(s) if r.timer_id == "t2"]
    assert gate(s, [t2], rate="r", interval_ms=100, burst=1) == ["go"]
    assert gate(s, [pacer], rate="r", interval_ms=100, burst=1) == ["wait"]


def test_a_run_asking_again_later_than_an_interval_waits_for_its_rate(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    """T29 only while the run's lateness is less than an interval: later, moving the
    rate's slots on would cost it more than the slot the run let go, so it waits for its
    rate behind the pacer, and the pacer keeps its slot."""
    for i in range(2):
        add(s, f"t{i}", "t.f:", -40 + i)
    runs = claim(s)
    assert gate(s, runs, rate="r", interval_ms=100, burst=1) == ["go", "wait"]  # t1 paces
    slot = slot_of(fake, "t1")
    clock.ms += 101
    assert gate(s, runs[:1], rate="r", interval_ms=100, burst=1) == ["wait"]
    assert slot_of(fake, "t1") == slot
    assert fake.zrange(KS.rate_queue("r"), 0, -1) == [b"t0"]


def test_a_burst_lets_that_many_start_at_once(s: Scripts) -> None:
    for i in range(4):
        add(s, f"t{i}", "t.f:", -40 + i)
    runs = claim(s)
    assert gate(s, runs, rate="r", interval_ms=60_000, burst=3) == ["go", "go", "go", "wait"]


def test_bad_gate_arguments_write_nothing(s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a")
    [a] = claim(s)
    with pytest.raises(Exception, match="bad run 1"):
        s.gate(LEASE, [GateRun(a.token, "k", 0)])
    with pytest.raises(Exception, match="bad run 1"):
        s.gate(LEASE, [GateRun(a.token, "", 1, "r", 0, 1)])
    assert fake.zcard(KS.slots("k")) == 0 and fake.zcard(KS.running) == 1


def test_rescheduling_a_waiting_timer_takes_it_out_of_its_queue_and_restarts_its_lateness(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)
    a, b = claim(s)
    gate(s, [a, b], key="k", limit=1)
    assert b"w=" in fake.hget(KS.records, "b")
    due = s.reschedule("b", "in", 60_000)
    assert fake.zscore(KS.due, "b") == due
    assert fake.zcard(KS.key_queue("k")) == 0 and fake.hget(KS.parked, "b") is None
    assert b"w=" not in fake.hget(KS.records, "b")


@pytest.mark.parametrize("record", ["t.f;p=abc:", "t.f;p=99999:", "t.f;p=1.5:", "t.f;g=:"])
def test_a_record_with_an_unreadable_group_or_priority_is_claimed_as_default(
        s: Scripts, record: str) -> None:
    add(s, "x", record)
    assert ids(claim(s)) == ["x"]


# -- handoff: the finishing listener takes the next in line ----------------------------


def finish_taking(s: Scripts, run: Run, take: int = 1,
                  groups: tuple[str, ...] = ("default",)) -> list[Run]:
    reply = s.finish(retention_ms=1000, endings=[(run.token, "ok", "", "")],
                     taker=Taker("me", groups, take, LEASE))
    items = reply[1:]
    return [Run.parse(*items[i:i + 3]) for i in range(0, len(items), 3)]


def test_a_freed_slot_hands_the_next_timer_to_the_listener_that_freed_it(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)
    a, b = claim(s)
    gate(s, [a, b], key="k", limit=1)
    [handed] = finish_taking(s, a)
    assert (handed.timer_id, handed.source) == ("b", "handoff")
    assert handed.waited_from_ms == b.due_ms  # its lateness counts the wait
    assert fake.zcard(KS.due) == 0 and claim(s) == []  # nobody else can take it
    assert fake.zrange(KS.slots("k"), 0, -1) == [handed.token.encode()]
    assert gate(s, [handed], key="k", limit=1) == ["go"]


def test_no_handoff_without_free_slots_or_to_a_listener_of_other_groups(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f;g=video:", -10)
    [a] = claim(s)
    [b] = claim(s, groups=("video",))
    gate(s, [a, b], key="k", limit=1)
    assert finish_taking(s, a, groups=("default",)) == []  # b is a video timer
    [again] = claim(s, groups=("video",))  # promoted into its group's due index instead
    assert again.timer_id == "b"
    fake.delete(KS.slots("k"))
    add(s, "c", "t.f:", -20)
    add(s, "d", "t.f:", -10)
    c, d = claim(s)
    gate(s, [c, d], key="k2", limit=1)
    assert finish_taking(s, c, take=0) == []
    assert ids(claim(s)) == ["d"]


def test_a_rate_slot_not_used_at_its_time_is_not_carried_through_a_keys_queue(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    both = {"key": "k", "limit": 1, "rate": "r", "interval_ms": 5_000, "burst": 1}  # < LEASE
    add(s, "x", "t.f:", -30)
    [x] = claim(s)
    assert gate(s, [x], **both) == ["go"]
    finish(s, x)
    add(s, "b", "t.f:", -20)
    [b] = claim(s)
    assert gate(s, [b], **both) == ["wait"]  # the key is free, the rate is not
    add(s, "a", "t.f;p=5:", -10)  # ahead of b in the key's order (a later one waits behind b)
    [a] = claim(s)
    assert gate(s, [a], key="k", limit=1) == ["go"]  # the key's slot goes to another run
    clock.ms = slot_of(fake, "b")  # b's rate slot time has come
    [b] = claim(s)
    assert gate(s, [b], **both) == ["wait"]  # the key is full: b waits for it
    finish(s, a)
    [b] = claim(s)
    # b's rate slot passed unused while it waited: it asks the rate again, so it never
    # starts closer than the interval to the start before it (no bunch as slots free)
    assert gate(s, [b], **both) == ["wait"]


def test_the_next_rate_slot_is_an_interval_after_a_start_even_if_the_rate_lost_its_time(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    rate = {"rate": "r", "interval_ms": 1_000, "burst": 1}
    add(s, "a", "t.f:", -30)
    add(s, "b", "t.f:", -20)
    add(s, "c", "t.f:", -10)
    runs = claim(s)
    assert gate(s, runs, **rate) == ["go", "wait", "wait"]  # b holds the next slot
    clock.ms = slot_of(fake, "b") + 300  # its slot came (and went: a late start)
    fake.hset(KS.rate("r"), "tat", 0)  # and the rate's own time was lost (a restart)
    [b] = claim(s)
    assert gate(s, [b], **rate) == ["go"]
    # c's slot is an interval after b's start (a late start, or a lost tat, cannot bunch)
    assert slot_of(fake, "c") >= clock.ms + 1_000 - 5


def test_a_pacer_gated_before_its_slot_waits_for_it_and_stays_the_pacer(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    """T23: a listener whose estimate of the Redis clock runs ahead gates the rate's pacer
    before its slot; it does not start then (closer than an interval to the start that gave
    it the slot) but at its slot, still the pacer."""
    rate = {"rate": "r", "interval_ms": 1_000, "burst": 1}
    add(s, "a", "t.f:", -30)
    add(s, "b", "t.f:", -20)
    add(s, "c", "t.f:", -10)
    assert gate(s, claim(s), **rate) == ["go", "wait", "wait"]  # b paces, c waits
    started = clock.ms
    slot = slot_of(fake, "b")
    assert slot >= started + 1_000 - 5
    clock.ms = slot - 10  # its listener's estimate of the Redis clock runs 10 ms ahead
    reply = s.claim(limit=10, lease_ms=LEASE, horizon_ms=100, listener_id="me")
    [early] = [Run.parse(*reply[i:i + 3]) for i in range(3, len(reply), 3)]
    assert early.timer_id == "b" and early.due_ms == slot
    assert gate(s, [early], **rate) == ["wait"]
    assert fake.zscore(KS.due_index(), "b") == slot
    assert fake.hget(KS.rate("r"), "pacer") == b"b"
    assert fake.zscore(KS.running, early.token) is None  # its run dropped, nothing started
    assert fake.hget(KS.rate("r"), "last") == b"%d" % started
    clock.ms = slot
    [b] = claim(s)
    assert b.timer_id == "b" and gate(s, [b], **rate) == ["go"]
    assert fake.hget(KS.rate("r"), "last") == b"%d" % slot
    assert fake.zrange(KS.due_index(), 0, -1) == [b"c"]  # the next slot is c's


@pytest.mark.parametrize("away_ms", [120_000, 20_000])
def test_a_rate_keeps_its_interval_after_its_pacer_waited_long(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock, away_ms: int) -> None:
    """Listeners away while a pacer waits for its slot (and the run of the last start
    lapses): when they come back with new timers, one start per interval on the gate's
    clock. Two minutes away: the rate's hash used to expire (a minute after its `tat`) with
    its `pacer`, a second pacer was promoted and both were paid at once (1 ms apart). 20 s
    away, the hash evicted (an `allkeys-*` policy): only the rate's own pacer is paid."""
    rate = {"rate": "r", "interval_ms": 100, "burst": 1}
    for i in range(4):
        add(s, f"t{i}", "t.f:", -40 + i)
    assert gate(s, claim(s), **rate) == ["go", "wait", "wait", "wait"]
    starts = [clock.ms]
    if away_ms < 60_000:
        fake.delete(KS.rate("r"))
    clock.ms += away_ms
    add(s, "n1", "t.f:", -1)
    add(s, "n2", "t.f:", -1)
    for _ in range(600):  # a listener claiming and gating what is due, every ms
        runs = claim(s)
        for run, status in zip(runs, gate(s, runs, **rate) if runs else [], strict=True):
            if status == "go":
                starts.append(clock.ms)
                finish(s, run)
        clock.ms += 1
    assert len(starts) == 7  # t0 (and its rerun: its lease lapsed), t1 to t3, n1, n2
    gaps = [b - a for a, b in pairwise(starts)]
    assert min(gaps) >= 100 - 5, gaps
    clock.ms += 61_000  # and with nothing left to pace, the rate leaves nothing behind
    assert not fake.exists(KS.rate("r"))


def test_a_pacer_cancelled_after_a_long_wait_hands_the_rate_to_the_next_timer(
        s: Scripts, fake: fakeredis.FakeRedis, clock: VirtualClock) -> None:
    """The rate's hash keeps its pacer however long it waits: cancelled two minutes on,
    its slot goes to the next waiting timer (with the pacer forgotten, that one waited
    in its queue until another timer of the rate came). Without a pacer, the hash is gone
    a minute after its last slot."""
    rate = {"rate": "r", "interval_ms": 100, "burst": 1}
    for i in range(4):
        add(s, f"t{i}", "t.f:", -40 + i)
    [t0, *_] = runs = claim(s)
    assert gate(s, runs, **rate) == ["go", "wait", "wait", "wait"]
    finish(s, t0)
    clock.ms += 120_000
    assert s.cancel("t1") == 1  # the pacer
    [t2] = claim(s)
    assert t2.timer_id == "t2" and gate(s, [t2], **rate) == ["go"]
    finish(s, t2)
    assert s.cancel("t3") == 1  # the next pacer: nothing waits for the rate now
    clock.ms += 61_000
    assert not fake.exists(KS.rate("r"))


def claim_one(s: Scripts) -> Run:
    """One claim of one timer, by a listener that names the keyed task ``t.f``."""
    reply = s.claim(limit=1, lease_ms=LEASE, horizon_ms=0, listener_id="me",
                    keyed_tasks=("t.f",))
    return Run.parse(*reply[3:6])


def test_a_free_slot_waits_for_an_earlier_timer_claimed_and_not_gated_yet(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """The order barrier: two listeners each claim one timer of a keyed task; the later
    one reaches the gate first, and waits for the earlier one, which goes first."""
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)

    a, b = claim_one(s), claim_one(s)
    assert fake.zrange(KS.ungated("t:t.f"), 0, -1) == [b"a", b"b"]
    assert fake.hget(KS.ungated_tokens, "b") == b.token.encode()
    assert gate(s, [b], key="k", limit=1) == ["wait"]  # a, earlier, is not gated yet
    assert fake.hget(KS.barred, "k") == b"1"
    assert gate(s, [a], key="k", limit=1) == ["go"]
    assert fake.zcard(KS.ungated("t:t.f")) == 0 and not fake.exists(KS.barred)
    finish(s, a)
    assert ids(claim(s)) == ["b"]  # then b, promoted in its turn


def test_a_run_ended_before_its_gate_leaves_the_order_barrier_and_one_handed_back_bars(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """A keyed task's run that ends dead before its gate (its crashes reached the limit,
    its task refused) leaves nothing in the order barrier; one handed back unstarted
    (T17) keeps its place there while it is pending ("p|"): the later one waits for it
    until a claim notes it anew, and a cancel takes its place away."""
    add(s, "a", "t.f:", -30)
    add(s, "b", "t.f:", -20)
    add(s, "c", "t.f:", -10)

    a, b, c = claim_one(s), claim_one(s), claim_one(s)
    s.finish(retention_ms=1000, endings=[(a.token, "fail", f"a:{a.token}", "{}")])
    assert fake.zrange(KS.ungated("t:t.f"), 0, -1) == [b"b", b"c"]
    assert fake.hget(KS.ungated_tokens, "a") is None
    s.finish(retention_ms=1000, endings=[(b.token, "release", "", "")])
    assert fake.hget(KS.ungated_tokens, "b") == b"p|t:t.f"
    assert gate(s, [c], key="k", limit=1) == ["wait"]  # b, pending again, goes first
    assert s.cancel("b") == 1
    assert fake.zrange(KS.ungated("t:t.f"), 0, -1) == []
    assert ids(claim(s)) == ["c"]  # promoted once b's place is gone


def test_a_run_handed_back_after_its_gate_keeps_its_place_among_its_keys_later_timers(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """T17 after the gate (a rate's run past its start window, a listener stopping): the
    slot it held is kept for its timer, and while it is pending it bars its key's later
    timers too ("p|"), so the key's other free slot does not go to a later one first."""
    add(s, "a", "t.f;k=dev:", -20)
    [a] = claim(s)
    assert gate(s, [a], key="dev", limit=2) == ["go"]
    add(s, "b", "t.f;k=dev:", -10)
    [b] = claim(s)
    s.finish(retention_ms=1000, endings=[(a.token, "release", "", "")])
    assert fake.hget(KS.ungated_tokens, "a") == b"p|k:dev"
    assert gate(s, [b], key="dev", limit=2) == ["wait"]  # a, pending again, goes first
    [again] = claim(s)
    assert again.timer_id == "a" and gate(s, [again], key="dev", limit=2) == ["go"]
    [later] = claim(s)  # b, promoted once a went
    assert later.timer_id == "b" and gate(s, [later], key="dev", limit=2) == ["go"]
    assert fake.hget(KS.ungated_tokens, "a") is None


def test_the_barrier_lifts_when_the_earlier_claim_is_gone(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "a", "t.f:", -20)
    add(s, "b", "t.f:", -10)
    reply = s.claim(limit=2, lease_ms=LEASE, horizon_ms=0, listener_id="me",
                    keyed_tasks=("t.f",))
    a, b = (Run.parse(*reply[i:i + 3]) for i in (3, 6))
    fake.zadd(KS.running, {a.token: 0})  # a's listener died before its gate
    fake.hdel(KS.running_records, a.token)  # ... and its run is gone
    assert gate(s, [b], key="k", limit=1) == ["go"]


def test_a_keyed_timer_waiting_for_its_rate_holds_its_keys_later_timers_until_it_goes(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """The rate-wait rule (docs/state-machine.md, invariant 2): a timer of a key waiting for
    its rate keeps its place in its key's order; cancelling it lets the key's next go."""
    both = {"key": "k", "limit": 1, "rate": "r", "interval_ms": 5_000, "burst": 1}  # < LEASE
    add(s, "x", "t.f:", -30)
    [x] = claim(s)
    assert gate(s, [x], rate="r", interval_ms=60_000, burst=1) == ["go"]
    add(s, "b", "t.f;k=k:", -20)
    [b] = claim(s)
    assert gate(s, [b], **both) == ["wait"]  # the key is free, the rate is not
    add(s, "c", "u.g;k=k:", -10)  # another task, the same key, after b
    [c] = claim(s)
    assert gate(s, [c], key="k", limit=1) == ["wait"]  # behind b in k's order
    assert s.cancel("b") == 1
    assert fake.zscore(KS.due_index(), "c") == 0  # promoted: k's slot is kept for it
    [c] = claim(s)
    assert gate(s, [c], key="k", limit=1) == ["go"]
