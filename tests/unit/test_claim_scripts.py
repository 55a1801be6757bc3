"""The claim, renew and finish Lua scripts, driven directly as a listener drives them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import fakeredis

from tests.unit.helpers import claim, redis_now_ms, run
from timers import Timers
from timers.model.encoding import as_text, escape_id
from timers.model.keys import Keyspace
from timers.store.script_calls import ScriptCalls

PAST = datetime(2001, 1, 1, tzinfo=UTC)
FAR = 3600.0


def finish(
    scripts: dict[str, Any], ks: Keyspace, *items: tuple[str, str, str, str],
    retention_ms: int = 7 * 86_400_000,
) -> int:
    """Call the finish script with endings ``(token, kind, a, b)``; returns late finishes."""
    return int(run(scripts, ScriptCalls(ks).finish(retention_ms=retention_ms, endings=items))[0])


def ok(token: str) -> tuple[str, str, str, str]:
    return (token, "ok", "", "")


def fail(token: str, failure_id: str, data: dict[str, Any]) -> tuple[str, str, str, str]:
    return (token, "fail", failure_id, json.dumps(data))


def reject(failure_id: str, data: dict[str, Any]) -> tuple[str, str, str, str]:
    return ("", "reject", failure_id, json.dumps(data))


def renew(scripts: dict[str, Any], ks: Keyspace, *tokens: str, lease_ms: int = 15_000) -> list[str]:
    return [as_text(t) for t in run(scripts, ScriptCalls(ks).renew(lease_ms, tokens))]


def lapse(fake: fakeredis.FakeRedis, ks: Keyspace, token: str) -> None:
    """Make a run's lease deadline long past, as if its listener died."""
    fake.zadd(ks.running, {token: 0}, xx=True)


def counters(fake: fakeredis.FakeRedis, ks: Keyspace) -> dict[str, int]:
    return {as_text(k): int(v) for k, v in fake.hgetall(ks.stats).items()}


def failure_record(fake: fakeredis.FakeRedis, ks: Keyspace, failure_id: str) -> Any:
    raw = fake.hget(ks.failure_records, failure_id)
    return None if raw is None else json.loads(raw)


# -- claim -------------------------------------------------------------------------------


def test_claim_takes_only_due_timers(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    due = producer.schedule("a.due", [1], at=PAST, id="due")
    later = producer.schedule("a.later", [2], in_=FAR, id="later")
    later_due = fake.zscore(ks.due, later)

    reply = claim(scripts, ks)

    assert reply.entries == ["due:a.due:[1]"]
    (run,) = reply.claimed
    assert (run.reruns, run.due_ms, run.source) == (0, round(PAST.timestamp() * 1000), "s")
    assert reply.next_due == later_due
    assert producer.get(due) is None
    assert producer.get(later) is not None
    assert fake.zrange(ks.due, 0, -1) == [b"later"]
    assert fake.hkeys(ks.records) == [b"later"]


def test_claim_reply_carries_redis_time_and_lease_head(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    empty = claim(scripts, ks)
    assert (empty.next_due, empty.next_lease, empty.claimed) == (-1, -1, [])

    producer.schedule("a.b", at=PAST)
    before = redis_now_ms(fake)
    reply = claim(scripts, ks, lease_ms=20_000)
    after = redis_now_ms(fake)
    assert before <= reply.now_us // 1000 <= after
    assert before + 20_000 <= reply.next_lease <= after + 20_000
    (token,) = (c.token for c in reply.claimed)
    assert fake.zscore(ks.running, token) == reply.next_lease
    assert fake.hget(ks.running_records, token) == reply.claimed[0].run.encode()


def test_claim_horizon_takes_timers_due_within_it(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], in_=3, id="soon")
    producer.schedule("a.b", [2], in_=FAR, id="later")
    assert claim(scripts, ks).claimed == []

    (run,) = claim(scripts, ks, horizon_ms=5_000).claimed

    assert (run.entry, run.source) == ("soon:a.b:[1]", "s")
    assert run.due_ms > redis_now_ms(fake)  # held, to be started at its due time
    assert producer.get("later") is not None


def test_claim_respects_the_limit_earliest_first(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    for i in range(5):
        producer.schedule("a.b", [i], at=datetime(2001, 1, 1 + i, tzinfo=UTC), id=f"t{i}")

    first = claim(scripts, ks, limit=2)
    rest = claim(scripts, ks, limit=10)

    assert first.entries == ["t0:a.b:[0]", "t1:a.b:[1]"]
    assert rest.entries == ["t2:a.b:[2]", "t3:a.b:[3]", "t4:a.b:[4]"]
    assert claim(scripts, ks).claimed == []


def test_a_timer_is_claimed_exactly_once(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    tid = producer.schedule("a.b", at=PAST)
    winner = claim(scripts, ks, event_ids=(tid,))
    assert len(winner.claimed) == 1
    assert claim(scripts, ks, event_ids=(tid,)).claimed == []
    assert claim(scripts, ks).claimed == []


def test_a_server_that_lost_its_last_writes_gives_no_token_again(
    fake: fakeredis.FakeRedis, producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    """The token counter goes back with a server's lost writes (a restart without its last
    writes, a failover to a replica that was behind): a claim after it must still give a
    token above every token given before, or a new run would start with an older token
    than one already started (and a listener still running that one would take the new
    run for it)."""
    producer.schedule("a.b", at=PAST, id="one")
    producer.schedule("a.b", at=PAST, id="two")
    (first,) = claim(scripts, ks, limit=1).claimed
    fake.set(ks.sequence, 0)  # the writes since the server's last save are gone
    (second,) = claim(scripts, ks, limit=1).claimed
    assert int(second.token) > int(first.token)
    fake.delete(ks.sequence)
    producer.schedule("a.b", at=PAST, id="three")
    producer.schedule("a.b", at=PAST, id="four")
    tokens = [int(c.token) for c in claim(scripts, ks).claimed]  # one batch
    assert len(tokens) == 2 and min(tokens) > int(second.token)


def test_claimed_timer_key_is_deleted(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    tid = producer.schedule("a.b", [1], in_=FAR)
    fake.zadd(ks.due, {tid: 0})  # due now in the index, key still waiting to expire
    assert fake.keys("timers:*") != []
    assert len(claim(scripts, ks).claimed) == 1
    assert fake.keys("timers:*") == []


def timer_keys(fake: fakeredis.FakeRedis) -> set[str]:
    return {as_text(k).split(":")[1] for k in fake.keys("timers:*")}


def test_a_claim_leaves_the_keys_of_the_timers_it_does_not_take(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    # a claim does no work for timers it does not claim: a burst's first runs start
    # without waiting for the rest of the burst's keys (their events come as they expire)
    for i in range(5):
        producer.schedule("a.b", [i], in_=3, id=f"soon{i}")

    taken = claim(scripts, ks, limit=2, horizon_ms=5_000)

    assert len(taken.claimed) == 2
    assert timer_keys(fake) == {"soon2", "soon3", "soon4"}
    assert len(claim(scripts, ks, limit=10, horizon_ms=5_000).claimed) == 3


def test_event_ids_are_claimed_first_and_marked(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    producer.schedule("a.b", [0], at=datetime(2001, 1, 1, tzinfo=UTC), id="oldest")
    producer.schedule("a.b", [1], at=datetime(2002, 1, 1, tzinfo=UTC), id="x:evt")

    reply = claim(scripts, ks, limit=1, event_ids=(escape_id("x:evt"),))

    assert [(c.entry, c.source) for c in reply.claimed] == [("x%3Aevt:a.b:[1]", "e")]
    assert [(c.entry, c.source) for c in claim(scripts, ks).claimed] == [
        ("oldest:a.b:[0]", "s")]


def test_an_event_does_not_claim_a_keyed_timer_ahead_of_an_earlier_one_still_pending(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    """Three commands of a device came due while claims were refused (a full server); the
    first claim after it carries the event of the fourth. Claimed by name, that one took
    the device's slot before the three (FIFO per key broke in the chaos checker's run);
    the claim takes them in their order instead. A plain timer's event still goes first."""
    for i in range(4):
        producer.schedule("a.b", [i], at=datetime(2001, 1, 1, 0, 0, i, tzinfo=UTC),
                          id=f"c{i}", key="dev:1")
    producer.schedule("a.b", ["plain"], at=datetime(2002, 1, 1, tzinfo=UTC), id="plain")

    reply = claim(scripts, ks, limit=1, event_ids=("c3",))
    assert [(c.entry, c.source) for c in reply.claimed] == [("c0:a.b;k=dev%3A1:[0]", "s")]
    reply = claim(scripts, ks, limit=1, event_ids=("plain", "c3"))
    assert [(c.entry, c.source) for c in reply.claimed] == [("plain:a.b:[\"plain\"]", "e")]
    assert [c.entry.split(":")[0] for c in claim(scripts, ks).claimed] == ["c1", "c2", "c3"]


def test_event_ids_not_yet_due_or_unknown_are_not_claimed(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    producer.schedule("a.b", in_=FAR, id="future")
    reply = claim(scripts, ks, event_ids=("future", "unknown", "timers|due"))
    assert reply.claimed == []
    assert producer.get("future") is not None


def test_cancel_and_reschedule_after_claim_are_false(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    tid = producer.schedule("a.b", at=PAST)
    claim(scripts, ks)
    assert producer.cancel(tid) is False
    assert producer.reschedule(tid, in_=FAR) is False
    assert producer.stats().pending == 0


def test_cancelled_timer_is_never_claimed(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace
) -> None:
    tid = producer.schedule("a.b", at=PAST)
    assert producer.cancel(tid) is True
    assert claim(scripts, ks, event_ids=(tid,)).claimed == []


# -- leases ------------------------------------------------------------------------------


def test_lapsed_lease_is_reclaimed_under_a_new_token(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], at=PAST, id="t")
    (first,) = claim(scripts, ks).claimed
    assert claim(scripts, ks).claimed == []  # lease still held: nobody else gets it

    lapse(fake, ks, first.token)
    (second,) = claim(scripts, ks).claimed

    assert second.token != first.token
    assert (second.source, second.reruns, second.entry, second.due_ms) == (
        "r", 1, first.entry, first.due_ms)
    assert counters(fake, ks)["reruns"] == 1
    assert fake.zscore(ks.running, first.token) is None
    assert fake.hget(ks.running_records, first.token) is None

    lapse(fake, ks, second.token)
    (third,) = claim(scripts, ks).claimed
    assert (third.source, third.reruns) == ("r", 2)
    assert counters(fake, ks)["reruns"] == 2


def test_a_lapsed_run_of_a_group_is_rerun_in_its_group_however_often_it_lapses(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    """A rerun is held in the running set of its timer's group, so only that group's
    listeners take it over when it lapses again; a listener of another group never
    runs it."""
    producer.schedule("a.b", [1], at=PAST, id="t", group="video")
    video = ks.running_of("video")
    (first,) = claim(scripts, ks, groups=("video",)).claimed
    for reruns in (1, 2):
        fake.zadd(video, {first.token: 0}, xx=True)  # its listener died
        assert claim(scripts, ks).claimed == []  # a default listener: not its group
        (rerun,) = claim(scripts, ks, groups=("video",)).claimed
        assert (rerun.source, rerun.reruns) == ("r", reruns)
        assert fake.zscore(video, rerun.token) is not None
        assert fake.zscore(ks.running, rerun.token) is None
        first = rerun


def test_lease_of_one_ms_lapses_on_its_own(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    from tests.conftest import wait_until

    producer.schedule("a.b", at=PAST)
    (first,) = claim(scripts, ks, lease_ms=1).claimed
    recovered = wait_until(lambda: claim(scripts, ks).claimed, timeout=5,
                           message="the 1 ms lease to lapse")
    assert [(c.source, c.reruns) for c in recovered] == [("r", 1)]
    assert recovered[0].token != first.token


def test_renew_extends_held_leases_and_reports_lost_tokens(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], at=PAST)
    producer.schedule("a.b", [2], at=PAST)
    kept, stalled = claim(scripts, ks, lease_ms=1000).claimed
    lapse(fake, ks, stalled.token)
    (recovered,) = claim(scripts, ks, lease_ms=1000).claimed
    assert recovered.source == "r"

    before = redis_now_ms(fake)
    lost = renew(scripts, ks, kept.token, stalled.token, lease_ms=60_000)

    assert lost == [stalled.token]
    score = fake.zscore(ks.running, kept.token)
    assert score is not None and score >= before + 60_000
    assert fake.zscore(ks.running, stalled.token) is None  # not revived


# -- finish ------------------------------------------------------------------------------


def test_finish_counts_fired_and_failed_and_records_failures(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    for i in range(3):
        producer.schedule("a.b", [i], at=PAST, id=f"t{i}")
    runs = claim(scripts, ks).claimed
    failure = {"id": "t2", "kind": "error", "message": "boom"}

    late = finish(scripts, ks, ok(runs[0].token), ok(runs[1].token),
                  fail(runs[2].token, "t2", failure))

    assert late == 0
    assert counters(fake, ks) == {"fired": 2, "failed": 1}
    assert failure_record(fake, ks, "t2") == {"id": "t2", "kind": "error", "message": "boom"}
    assert fake.zcard(ks.running) == 0 and fake.hlen(ks.running_records) == 0
    failed = producer.failed()
    assert [(f.failure_id, f.timer_id, f.data["message"]) for f in failed] == [
        ("t2", "t2", "boom")]
    stats = producer.stats()
    assert (stats.running, stats.failed, stats.fired) == (0, 1, 2)


def test_a_second_dead_timer_under_one_id_keeps_the_first_record(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", at=PAST, id="t")
    (run,) = claim(scripts, ks).claimed
    finish(scripts, ks, fail(run.token, f"t:{run.token}", {"id": "t", "attempt": 1}))
    producer.schedule("a.b", at=PAST, id="t")
    (again,) = claim(scripts, ks).claimed
    finish(scripts, ks, fail(again.token, f"t:{again.token}", {"id": "t", "attempt": 2}))
    assert failure_record(fake, ks, f"t:{run.token}") == {"id": "t", "attempt": 1}
    assert failure_record(fake, ks, f"t:{again.token}") == {"id": "t", "attempt": 2}
    assert counters(fake, ks)["failed"] == 2
    assert producer.stats().failed == len(producer.failed()) == 2
    assert [f.data["attempt"] for f in producer.get_failures("t")] == [2, 1]


def test_rejected_entries_never_hide_a_run_failure(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", at=PAST, id="t")
    (run,) = claim(scripts, ks).claimed
    finish(scripts, ks, fail(run.token, f"t:{run.token}", {"kind": "error"}))

    finish(scripts, ks, reject("t", {"kind": "rejected"}))
    assert failure_record(fake, ks, "t") is None
    assert failure_record(fake, ks, f"t:{run.token}") == {"kind": "error"}
    assert "rejected" not in counters(fake, ks)

    finish(scripts, ks, reject(":abc", {"kind": "rejected"}))
    finish(scripts, ks, reject(":abc", {"kind": "rejected", "second": True}))
    assert failure_record(fake, ks, ":abc") == {"kind": "rejected"}
    assert counters(fake, ks)["rejected"] == 1
    assert sorted(f.failure_id for f in producer.failed()) == [":abc", f"t:{run.token}"]


def test_finish_of_a_token_taken_over_is_late_and_changes_nothing(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", at=PAST, id="t")
    (stalled,) = claim(scripts, ks).claimed
    lapse(fake, ks, stalled.token)
    (recovered,) = claim(scripts, ks).claimed

    late = finish(scripts, ks, fail(stalled.token, "t", {"kind": "error"}))

    assert late == 1
    assert failure_record(fake, ks, "t") is None
    assert "failed" not in counters(fake, ks) and "fired" not in counters(fake, ks)
    assert counters(fake, ks)["late_finishes"] == 1
    assert fake.zscore(ks.running, recovered.token) is not None  # the new run still holds it

    assert finish(scripts, ks, ok(recovered.token)) == 0
    assert counters(fake, ks)["fired"] == 1


def test_failure_retention_trims_old_records(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    now = redis_now_ms(fake)
    fake.zadd(ks.failures, {"ancient": 1, "old": now - 120_000, "recent": now - 1_000})
    fake.hset(ks.failure_records, mapping={"ancient": "{}", "old": "{}", "recent": "{}"})
    producer.schedule("a.b", at=PAST, id="new")
    (run,) = claim(scripts, ks).claimed

    finish(scripts, ks, fail(run.token, "new", {}), retention_ms=60_000)

    assert sorted(fake.zrange(ks.failures, 0, -1)) == [b"new", b"recent"]
    assert sorted(fake.hkeys(ks.failure_records)) == [b"new", b"recent"]


# -- retries and hand-backs --------------------------------------------------------------


def test_retry_puts_the_timer_back_with_its_new_record_after_the_delay(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], at=PAST, id="t:1")
    (run,) = claim(scripts, ks).claimed
    before = redis_now_ms(fake)

    finish(scripts, ks, (run.token, "retry", "t%3A1:a.b;a=1:[1]", "60000"))

    timer = producer.get("t:1")
    assert timer is not None and (timer.task, timer.args, timer.attempts) == ("a.b", [1], 1)
    assert round(timer.due.timestamp() * 1000) >= before + 60_000
    assert fake.keys("timers:*") == [b"timers:t%3A1:a.b;a=1:[1]"]
    assert counters(fake, ks)["retried"] == 1
    assert fake.zcard(ks.running) == 0
    assert claim(scripts, ks).claimed == []  # not before its delay


def test_a_retry_keeps_an_earlier_dead_timers_record_and_drops_its_rejected_event(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    """Issue 9 row 16: a retry of a later timer with the same id deleted the record of
    the earlier dead one (stats said failed=1, the list was empty)."""
    producer.schedule("a.b", at=PAST, id="t")
    (run,) = claim(scripts, ks).claimed
    dead_id = f"t:{run.token}"
    finish(scripts, ks, fail(run.token, dead_id, {"id": "t", "kind": "error"}))
    producer.schedule("a.b", at=PAST, id="t")
    finish(scripts, ks, reject("t", {"id": "t", "kind": "rejected"}))  # hidden: t is dead
    fake.hset(ks.failure_records, "t", json.dumps({"id": "t", "kind": "rejected"}))
    fake.zadd(ks.failures, {"t": 1})  # as a rejected event before the dead record wrote
    (again,) = claim(scripts, ks).claimed

    finish(scripts, ks, (again.token, "retry", "t:a.b;a=1:", "0"))

    assert failure_record(fake, ks, dead_id) == {"id": "t", "kind": "error"}
    assert failure_record(fake, ks, "t") is None  # the rejected event's record is gone
    assert [f.failure_id for f in producer.failed()] == [dead_id]
    assert producer.stats().failed == 1
    assert [c.entry for c in claim(scripts, ks).claimed] == ["t:a.b;a=1:"]


def test_retry_never_overwrites_a_timer_scheduled_again_meanwhile(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], at=PAST, id="t")
    (run,) = claim(scripts, ks).claimed
    producer.schedule("a.new", [9], in_=FAR, id="t")

    finish(scripts, ks, (run.token, "retry", "t:a.b;a=1:[1]", "0"))

    timer = producer.get("t")
    assert timer is not None and (timer.task, timer.args) == ("a.new", [9])
    assert fake.keys("timers:*") == [b"timers:t:a.new:[9]"]
    assert "retried" not in counters(fake, ks)


def test_release_hands_the_run_back_at_its_old_due_time(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], at=PAST, id="t")
    (run,) = claim(scripts, ks).claimed

    finish(scripts, ks, (run.token, "release", "", ""))

    timer = producer.get("t")
    assert timer is not None and timer.due == PAST
    assert counters(fake, ks)["handed_back"] == 1
    (again,) = claim(scripts, ks).claimed
    assert (again.entry, again.due_ms, again.source) == ("t:a.b:[1]", run.due_ms, "s")


def test_a_late_retry_or_release_changes_nothing(
    producer: Timers, scripts: dict[str, Any], ks: Keyspace, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], at=PAST, id="t")
    (stalled,) = claim(scripts, ks).claimed
    lapse(fake, ks, stalled.token)
    (recovered,) = claim(scripts, ks).claimed

    late = finish(scripts, ks, (stalled.token, "retry", "t:a.b;a=1:[1]", "0"),
                  (stalled.token, "release", "", ""))

    assert late == 2
    assert producer.get("t") is None
    assert fake.zscore(ks.running, recovered.token) is not None
