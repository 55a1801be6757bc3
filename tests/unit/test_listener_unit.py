"""The listener on fakeredis: runs due timers once, records every bad ending, and keeps going.

fakeredis publishes no keyspace events, so timers reach the listener through its sweeper;
events are fed to ``listener.lanes[0].events.handle`` directly, as the subscription would.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest

from tests.conftest import wait_until_async
from tests.unit.conftest import SAMPLE_TASKS
from tests.unit.helpers import burst, make_listener, run_burst
from tests.unit.sample_tasks import limited, mod, slow
from timers import Failure, Fired, Listener, Timers, TimerSpec
from timers.listener.quarantine.parent import Quarantine
from timers.model.encoding import as_text
from timers.model.runs import Outcome
from timers.store.replicated import UnreplicatedReply

PAST = datetime(2001, 1, 1, tzinfo=UTC)
FAR = 3600.0
EXPIRED = b"__keyevent@0__:expired"
WAKE = b"timers|wake"
DEADLINE = 15.0  # seconds a burst may take before the test fails instead of hanging


@pytest.fixture(autouse=True)
def clean_calls() -> Iterator[None]:
    slow.DONE.clear()
    yield
    slow.DONE.clear()


def expired(listener: Listener, key: bytes) -> None:
    listener.lanes[0].events.handle({"type": "message", "channel": EXPIRED, "data": key})


def failures_by_id(producer: Timers) -> dict[str, Failure]:
    """Failure records by timer id (or by failure id for a key that named no timer)."""
    return {f.timer_id or f.failure_id: f for f in producer.failed()}


def counters(producer: Timers) -> dict[str, int]:
    return producer.stats().counters


# -- running due timers ------------------------------------------------------------------


def test_due_timers_run_once_with_their_args(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    producer.schedule("mod.add", [1, 2], at=PAST)
    producer.schedule("mod.add", {"a": 5}, at=PAST)
    producer.schedule("mod.greet", {"name": "ann", "greeting": "hi"}, at=PAST)
    producer.schedule("mod.greet", ["bob"], in_=-1)
    producer.schedule("mod.async_add", [3, 4], at=PAST)
    future = producer.schedule("mod.add", [99], in_=FAR)

    run_burst(server)

    assert sorted(mod.CALLS) == sorted([
        ("add", (1, 2)), ("add", (5, 0)), ("greet", "hi ann"), ("greet", "hello bob"),
        ("async_add", (3, 4)),
    ])
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.fired, stats.failed) == (1, 0, 5, 0)
    assert producer.get(future) is not None

    run_burst(server)  # a second listener finds nothing left to run
    assert len(mod.CALLS) == 5


def test_two_listeners_run_each_timer_exactly_once(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    producer.schedule_many([{"task": "mod.add", "args": [i], "at": PAST} for i in range(60)])

    async def scenario() -> None:
        first = make_listener(server, concurrency=4)
        second = make_listener(server, concurrency=4)
        await asyncio.gather(burst(first), burst(second))

    asyncio.run(scenario())

    assert sorted(a for _, (a, _b) in mod.CALLS) == list(range(60))
    assert counters(producer)["fired"] == 60


def test_a_raising_task_is_recorded_and_the_listener_goes_on(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    bad = producer.schedule("mod.boom", ["it broke: ü"], at=datetime(2000, 1, 1, tzinfo=UTC))
    producer.schedule("mod.add", [1], at=PAST)
    producer.schedule("mod.add", [2], at=PAST)

    run_burst(server)

    assert sorted(mod.CALLS) == [("add", (1, 0)), ("add", (2, 0))]
    failure = failures_by_id(producer)[bad]
    assert failure.timer_id == bad
    data = failure.data
    assert (data["kind"], data["error_type"], data["message"]) == (
        "error", "ValueError", "it broke: ü")
    assert data["task"] == "mod.boom" and data["args"] == ["it broke: ü"]
    assert "raise ValueError(message)" in data["traceback"]
    assert data["attempts"] == 1
    stats = producer.stats()
    assert (stats.fired, stats.failed, stats.pending, stats.running) == (2, 1, 0, 0)


def test_args_that_do_not_fit_the_function_are_recorded_as_bad_args(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    unknown_kw = producer.schedule("mod.add", {"a": 1, "zzz": 2}, at=PAST)
    too_many = producer.schedule("mod.add", [1, 2, 3], at=PAST)
    missing = producer.schedule("mod.greet", None, at=PAST)

    run_burst(server)

    assert mod.CALLS == []
    failures = failures_by_id(producer)
    for tid in (unknown_kw, too_many, missing):
        assert (failures[tid].data["kind"], failures[tid].data["error_type"]) == (
            "bad_args", "TypeError")
    assert "zzz" in failures[unknown_kw].data["message"]


def test_a_fitting_call_does_not_let_a_later_misfit_through(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    """Shapes that bound once are remembered; other shapes of the same task still fail."""
    fits = producer.schedule("mod.add", [1, 2], at=PAST)
    fits_kw = producer.schedule("mod.add", {"a": 1, "b": 2}, at=PAST)
    run_burst(server)
    too_many = producer.schedule("mod.add", [1, 2, 3], at=PAST)
    wrong_kw = producer.schedule("mod.add", {"a": 1, "c": 2}, at=PAST)
    run_burst(server)

    failures = failures_by_id(producer)
    assert fits not in failures and fits_kw not in failures
    assert failures[too_many].data["kind"] == "bad_args"
    assert failures[wrong_kw].data["kind"] == "bad_args"
    assert len(mod.CALLS) == 2


def test_unknown_or_disallowed_tasks_are_refused_and_nothing_runs(
    server: fakeredis.FakeServer, producer: Timers, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: ran.append(a))
    ids = {
        task: producer.schedule(task, ["echo owned"], at=PAST)
        for task in ("mod.nope", "nope.fn", "os.system", "mod.system", "mod.Thing")
    }
    producer.schedule("mod.add", [1], at=PAST)

    run_burst(server)

    assert ran == []
    assert mod.CALLS == [("add", (1, 0))]
    failures = failures_by_id(producer)
    for task, tid in ids.items():
        data = failures[tid].data
        assert (data["kind"], data["error_type"], data["task"]) == (
            "refused", "TaskRefused", task)
    assert f"{SAMPLE_TASKS}.os" not in sys.modules


def test_the_observer_hears_of_every_run(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    ok = producer.schedule("mod.add", [1], at=PAST)
    failing = producer.schedule("mod.boom", ["x"], at=PAST)
    reports: list[Fired] = []

    run_burst(server, observer=reports.append)

    by_id = {r.timer_id: r for r in reports}
    assert set(by_id) == {ok, failing}
    assert (by_id[ok].task, by_id[ok].source, by_id[ok].attempt, by_id[ok].outcome.ok) == (
        "mod.add", "sweep", 1, True)
    assert (by_id[failing].outcome.kind, by_id[failing].outcome.error_type) == (
        "error", "ValueError")
    past_ms = round(PAST.timestamp() * 1000)
    assert all(r.due_ms == past_ms and r.lateness_ms > 0 for r in reports)


def test_a_failing_observer_does_not_stop_the_listener(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    def observer(_: Fired) -> None:
        raise RuntimeError("observer bug")

    for i in range(3):
        producer.schedule("mod.add", [i], at=PAST)
    run_burst(server, observer=observer)
    assert len(mod.CALLS) == 3
    assert counters(producer)["fired"] == 3


def test_burst_ends_soon_after_its_last_run_not_a_lease_later(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    producer.schedule("slow.work", [0.2], at=PAST)

    async def scenario() -> None:
        listener = make_listener(server, lease=30.0)
        await asyncio.wait_for(listener.run(burst=True), 5.0)
        await listener.redis.aclose()

    asyncio.run(scenario())
    assert slow.DONE == [0.2]
    assert counters(producer)["fired"] == 1


# -- events fed to the listener ----------------------------------------------------------


REJECTED_KEYS = [
    b"timers:no-colon-after-id",
    b"timers:%zz:mod.add:[1]",  # bad escape
    b"timers:id:mod.add:5",  # args not a list or dict
    b"timers:id:mod.add:[1",  # not JSON
    b"timers:\xff\xfe:mod.add:[1]",  # not UTF-8
    b"timers:id1:builtins.eval:[\"__import__('os').system('x')\"]",
    b"timers:id2:os.system:[\"touch /tmp/owned\"]",
    b"timers:id3:..:[]",
    b"timers:id4:__import__:[\"os\"]",
    b"timers:id5:mod.system:[\"x\"]",
]


def test_bad_event_keys_are_recorded_as_rejected_and_run_nothing(
    server: fakeredis.FakeServer, producer: Timers, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: ran.append(a))
    before_modules = set(sys.modules)

    def feed(listener: Listener) -> None:
        for key in REJECTED_KEYS:
            expired(listener, key)

    run_burst(server, before=feed)

    assert ran == [] and mod.CALLS == []
    imported = {m for m in set(sys.modules) - before_modules if m.startswith(SAMPLE_TASKS)}
    assert imported <= {f"{SAMPLE_TASKS}.mod"}
    failures = producer.failed(limit=100)
    assert len(failures) == len(REJECTED_KEYS)
    assert {f.data["kind"] for f in failures} == {"rejected"}
    assert counters(producer)["rejected"] == len(REJECTED_KEYS)
    keys = {f.data["key"] for f in failures}
    assert "timers:\\xff\\xfe:mod.add:[1]" in keys
    named = {f.data["id"] for f in failures if f.data["id"] is not None}
    assert named == {"id1", "id2", "id5"}  # the keys whose id decoded


def test_the_same_bad_key_twice_is_one_record(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    def feed(listener: Listener) -> None:
        expired(listener, b"timers:%zz:mod.add:[1]")
        expired(listener, b"timers:%zz:mod.add:[1]")

    run_burst(server, before=feed)
    run_burst(server, before=feed)  # another listener sees the same event
    assert len(producer.failed()) == 1


def test_keys_outside_the_prefix_are_ignored(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    def feed(listener: Listener) -> None:
        for key in (b"other:id:mod.add:[1]", b"timers|due", b"timersx:id:mod.add:[1]",
                    b"\xff\xfe", b"", b"session:123"):
            expired(listener, key)
        listener.lanes[0].events.handle({"type": "message", "channel": b"other-channel",
                                "data": b"timers:%zz:mod.add:[1]"})
        listener.lanes[0].events.handle({"type": "subscribe", "channel": EXPIRED, "data": 1})

    run_burst(server, before=feed)
    assert producer.failed() == []
    assert "rejected" not in counters(producer)


def test_an_event_for_a_pending_timer_runs_its_stored_record_not_the_key(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    producer.schedule("mod.add", [1, 2], at=PAST, id="victim")
    forged = b'timers:victim:mod.boom:["forged"]'

    run_burst(server, before=lambda listener: expired(listener, forged))

    assert mod.CALLS == [("add", (1, 2))]
    assert producer.failed() == []
    assert counters(producer)["fired"] == 1


def test_an_event_for_a_timer_not_yet_due_does_not_run_it(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    tid = producer.schedule("mod.add", [1], in_=FAR)
    key = as_text(producer.redis.keys("timers:*")[0]).encode()

    run_burst(server, before=lambda listener: expired(listener, key))

    assert mod.CALLS == []
    assert producer.get(tid) is not None


def test_a_wake_message_moves_the_next_due_time_earlier() -> None:
    async def scenario() -> None:
        listener = make_listener(fakeredis.FakeServer())
        tracker = listener.lanes[0].tracker
        tracker.observe_heads(10_000_000.0, None)

        listener.lanes[0].events.handle({"type": "message", "channel": WAKE, "data": b"5000000"})
        assert tracker.next_due_ms == 5_000_000
        listener.lanes[0].events.handle({"type": "message", "channel": WAKE, "data": b"8000000"})
        assert tracker.next_due_ms == 5_000_000
        listener.lanes[0].events.handle({"type": "message", "channel": WAKE, "data": "4000000"})
        assert tracker.next_due_ms == 4_000_000
        for garbage in (b"soon", b"", b"\xff"):
            listener.lanes[0].events.handle({"type": "message", "channel": WAKE, "data": garbage})
        assert tracker.next_due_ms == 4_000_000
        await listener.redis.aclose()

    asyncio.run(scenario())


def test_a_wake_message_reaches_a_running_listener(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    """A timer scheduled while the listener sleeps runs through the wake, not a poll."""

    async def scenario() -> None:
        fired = asyncio.Event()
        listener = make_listener(server, max_sleep=60.0, observer=lambda _: fired.set())
        stop = asyncio.Event()
        running = asyncio.create_task(listener.run(stop))
        async with asyncio.timeout(DEADLINE):
            await listener.subscribed.wait()
            await asyncio.to_thread(producer.schedule, "mod.add", [7], in_=0.05)
            await fired.wait()  # long before max_sleep: the wake woke the sweeper
            stop.set()
            await running
        await listener.redis.aclose()

    asyncio.run(scenario())
    assert mod.CALLS == [("add", (7, 0))]


def test_a_claim_ahead_of_the_due_time_takes_half_the_listeners_slots(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    """Listeners that wake for one burst each take a share of its first timers (with
    concurrency keys, a listener keeps the keys of the runs it starts)."""
    limits: list[tuple[int, bool]] = []

    async def scenario() -> None:
        fired: list[Fired] = []
        all_fired = asyncio.Event()

        def observe(report: Fired) -> None:
            fired.append(report)
            if len(fired) == 6:
                all_fired.set()

        listener = make_listener(server, max_sleep=60.0, concurrency=4, observer=observe)
        claim = listener.lanes[0].claimer.scripts.claim

        async def recording_claim(**kwargs: Any) -> Any:
            limits.append((kwargs["limit"], listener.lanes[0].claimer._claiming_ahead()))
            return await claim(**kwargs)

        listener.lanes[0].claimer.scripts.claim = recording_claim  # type: ignore[method-assign]
        stop = asyncio.Event()
        running = asyncio.create_task(listener.run(stop))
        async with asyncio.timeout(DEADLINE):
            await listener.subscribed.wait()
            await asyncio.to_thread(producer.schedule_many, [
                TimerSpec("mod.add", [i], in_=0.3) for i in range(6)])
            await all_fired.wait()
            stop.set()
            await running
        await listener.redis.aclose()

    asyncio.run(scenario())
    assert sorted(mod.CALLS) == [("add", (i, 0)) for i in range(6)]
    ahead = [limit for limit, early in limits if early]
    assert ahead and max(ahead) == 2
    assert max(limit for limit, early in limits if not early) == 4


def test_a_listener_at_its_concurrency_sends_no_claim_as_a_run_ends_with_nothing_due(
    server: fakeredis.FakeServer, producer: Timers
) -> None:
    """A slot that frees while nothing is due brings no claim: a listener at its
    concurrency would otherwise ask Redis once per run that ends, for nothing (a fleet's
    idle cost). The next claim waits for the next due time it knows of, or an event."""
    claims_after_end: list[float] = []
    producer.schedule_many([TimerSpec("slow.work", [0.3], at=PAST, id="first"),
                            TimerSpec("slow.work", [0.3], at=PAST, id="second"),
                            TimerSpec("mod.add", [1], in_=FAR, id="later")])

    async def scenario() -> None:
        listener = make_listener(server, concurrency=1)
        claimer = listener.lanes[0].claimer
        claim = claimer.scripts.claim

        async def recording_claim(**kwargs: Any) -> Any:
            if len(slow.DONE) == 2:
                claims_after_end.append(kwargs["limit"])
            return await claim(**kwargs)

        claimer.scripts.claim = recording_claim  # type: ignore[method-assign]
        stop = asyncio.Event()
        running = asyncio.create_task(listener.run(stop))
        async with asyncio.timeout(DEADLINE):
            await wait_until_async(lambda: slow.DONE and listener.shared.running_count(),
                                   DEADLINE, message="the second run to start")
            # the timers' expired events are in by now; one read after the claim that
            # took its timer leaves a wake that a claim answers (a claim more, once):
            # the rule here is the freed slot's alone
            claimer.poke.clear()
            await wait_until_async(lambda: listener.ended_count == 2, DEADLINE,
                                   message="both runs to end")
            await asyncio.sleep(0.5)  # a claim would go within a turn of the loop
            stop.set()
            await running
        await listener.redis.aclose()

    asyncio.run(scenario())
    assert slow.DONE == [0.3, 0.3]
    assert claims_after_end == [], f"{len(claims_after_end)} claim(s) with nothing due"


def test_a_loop_that_dies_of_a_bug_stops_the_listener_as_crashed(
        server: fakeredis.FakeServer, caplog: pytest.LogCaptureFixture) -> None:
    """A listener's loops end only when it stops: one that dies of a bug (here the history
    trim loop) stops the whole listener, marked crashed (the command exits nonzero and a
    supervisor starts it again), rather than letting it limp on without that loop."""

    async def scenario() -> Listener:
        listener = make_listener(server)

        async def broken() -> None:
            raise RuntimeError("a bug in the loop")

        listener.lanes[0].trimmer.run = broken  # type: ignore[method-assign]
        await asyncio.wait_for(listener.run(asyncio.Event()), DEADLINE)  # never set
        await listener.redis.aclose()
        return listener

    caplog.set_level("CRITICAL", logger="timers")
    listener = asyncio.run(scenario())
    assert listener.crashed and listener.aborted
    assert [m for m in caplog.messages if m.startswith("timers-history-trim loop died")]


def test_a_run_gone_from_redis_when_it_ends_is_counted_and_logged_as_an_error(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """A run whose hold Redis no longer has when its ending is written (its keys evicted or
    flushed, or its lease lapsed and another listener took it): the run happened, so it is
    counted as a late finish and the listener says so in an ERROR line, never silently."""
    producer.schedule("mod.add", [1, 2], at=PAST, id="evicted")
    keys = producer.keys

    async def scenario() -> None:
        listener = make_listener(server)
        finish = listener.lanes[0].endings.scripts.finish
        redis = fakeredis.FakeAsyncRedis(server=server)

        async def after_the_runs_were_dropped(**kwargs: Any) -> Any:
            await redis.delete(keys.running, keys.running_records)  # as eviction would
            return await finish(**kwargs)

        listener.lanes[0].endings.scripts.finish = after_the_runs_were_dropped  # type: ignore[method-assign]
        await burst(listener)
        await redis.aclose()

    caplog.set_level("ERROR", logger="timers")
    asyncio.run(scenario())
    assert mod.CALLS == [("add", (1, 2))]
    assert counters(producer)["late_finishes"] == 1
    assert [m for m in caplog.messages
            if m.startswith("1 run(s) this listener held were gone from Redis")]


def test_an_ending_on_its_way_at_shutdown_is_not_written_twice(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """Stopping while a batch of endings is on its way (Redis has run it, the reply has not
    come yet), as the demo does after its last timer: cancelling that write and sending the
    batch again would count the run as a late finish and log an ERROR blaming eviction."""
    producer.schedule("mod.add", [1, 2], at=PAST, id="in-flight")

    async def scenario() -> None:
        stop = asyncio.Event()
        listener = make_listener(server)
        finish = listener.lanes[0].endings.scripts.finish

        async def written_then_slow(**kwargs: Any) -> Any:
            reply = await finish(**kwargs)
            stop.set()
            # a slow reply (the fake link's latency, not a wait for an outcome): it is on
            # its way while the listener stops
            await asyncio.sleep(0.5)
            return reply

        listener.lanes[0].endings.scripts.finish = written_then_slow  # type: ignore[method-assign]
        await asyncio.wait_for(listener.run(stop), DEADLINE)

    caplog.set_level("ERROR", logger="timers")
    asyncio.run(scenario())
    assert mod.CALLS == [("add", (1, 2))]
    assert counters(producer).get("late_finishes", 0) == 0
    assert counters(producer)["fired"] == 1
    assert not [m for m in caplog.messages if "gone from Redis" in m]



def _unconfirmed_once(scripts: Any, name: str, dropped: list[int], sent: list[str]) -> None:
    """``scripts.<name>`` answering its first reply that gives runs as one no replica
    confirmed (a listener with ``replicas=``: ``timers.store.replicated``), whose
    ``WAIT`` alone finds no replica twice, then one. ``sent``: each call (``name``) and
    each ``WAIT`` alone ("wait"), in order."""
    call = getattr(scripts, name)
    first = 3 if name == "claim" else 1  # the items before the runs
    in_sync = iter([0, 0])

    async def ask_again() -> int:
        sent.append("wait")
        return next(in_sync, 1)

    async def unconfirmed(**kwargs: Any) -> Any:
        sent.append(name)
        reply = await call(**kwargs)
        if len(reply) > first and not dropped:
            dropped.append((len(reply) - first) // 3)
            return UnreplicatedReply(reply, 0, 1, 300, ask_again)
        return reply

    setattr(scripts, name, unconfirmed)


def _quarantined(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(timer id, reruns) of each run sent to quarantine: a stand-in that runs nothing
    (unit tests start no processes) and reports the run completed."""
    seen: list[tuple[str, int]] = []

    async def in_quarantine(self: Quarantine, timer_id: str, token: str, task: str,
                            *args: Any) -> Outcome:
        seen.append((timer_id, args[3]))  # fn, args, policy, reruns, admit
        return Outcome("ok", "", "")

    monkeypatch.setattr(Quarantine, "run", in_quarantine)
    return seen


def _run_until(server: fakeredis.FakeServer, script: str, dropped: list[int],
               done: Callable[[], bool], sent: list[str] | None = None) -> None:
    async def scenario() -> None:
        listener = make_listener(server, lease=0.3)
        _unconfirmed_once(listener.lanes[0].scripts, script, dropped,
                          [] if sent is None else sent)
        stop = asyncio.Event()
        running = asyncio.create_task(listener.run(stop))
        async with asyncio.timeout(DEADLINE):
            await wait_until_async(done, DEADLINE, message="every timer to run")
            stop.set()
            await running
        await listener.redis.aclose()

    asyncio.run(scenario())


def test_a_run_whose_claim_no_replica_confirmed_runs_only_after_its_lease(
    server: fakeredis.FakeServer, producer: Timers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim too few replicas had in time starts none of its runs: a failover could
    lose the claim and run them again uncounted. The listener then claims nothing until
    ``WAIT`` alone finds the replica (each claim would take a batch more that waits out
    a lease). Their leases lapse and they run then, once each, counted as reruns (in
    quarantine, as any rerun)."""
    producer.schedule_many([TimerSpec("mod.add", [i, 0], at=PAST, id=f"t{i}")
                            for i in range(3)])
    quarantined, dropped, sent = _quarantined(monkeypatch), [], []
    _run_until(server, "claim", dropped, lambda: len(quarantined) == 3, sent)
    assert dropped == [3]
    assert sent[:5] == ["claim", "wait", "wait", "wait", "claim"], sent[:5]
    assert mod.CALLS == [], "a run started whose claim no replica confirmed"
    assert sorted(quarantined) == [(f"t{i}", 1) for i in range(3)]
    assert counters(producer).get("reruns") == 3


def test_a_run_an_unconfirmed_ending_hands_on_runs_only_after_its_lease(
    server: fakeredis.FakeServer, producer: Timers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the next run on a concurrency key that a batch of endings hands on:
    an ending too few replicas had in time starts none of the runs it hands on."""
    producer.schedule_many([TimerSpec("limited.command", [1, c], at=PAST, id=c)
                            for c in "abcd"])
    limited.RAN.clear()
    quarantined, dropped = _quarantined(monkeypatch), []
    _run_until(server, "finish", dropped, lambda: len(limited.RAN) + len(quarantined) == 4)
    assert dropped and dropped[0] >= 1
    assert sorted([*limited.RAN, *(tid for tid, _ in quarantined)]) == list("abcd")
    assert len(quarantined) == dropped[0] == counters(producer).get("reruns")


def test_a_burst_ends_saying_how_many_timers_a_rate_still_holds_back(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """Three timers of a ``2/m`` task due now: one starts at most (none, on a server that
    just started: its rate waits an interval), the rest wait for the rate's slots, after
    the burst too; its last line says how many, so a burst that ran fewer than were due
    says why."""
    for i in range(3):
        producer.schedule("limited.rated", [i], in_=0)
    with caplog.at_level("INFO", logger="timers.listener"):
        run_burst(server)
    stats = producer.stats()
    ran = stats.counters.get("fired", 0)
    assert ran <= 1 and stats.pending == 3 - ran
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("burst over")]
    assert said == [f"burst over with {3 - ran} timers held back by a concurrency key or a "
                    "rate limit: pending, for a listener running when their slots free"]


def test_a_helper_loop_that_fails_is_logged_and_the_listener_runs_on(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """Adopting dead listeners' journals and starting the quarantine process ahead are
    helps: when one fails, the listener says so in one line and fires its timers all the
    same (it adopts again at its next start; a quarantine process starts at the first
    rerun)."""
    producer.schedule("mod.add", [1, 2], at=PAST, id="t")

    def broken(listener: Listener) -> None:
        async def fails(*args: Any) -> None:
            raise RuntimeError("a helper broke")

        listener.shared.adopt_journals = fails  # type: ignore[method-assign]
        listener._start_quarantine = fails  # type: ignore[method-assign]

    with caplog.at_level("WARNING", logger="timers"):
        listener = run_burst(server, broken, quarantine_ahead=True)
    assert mod.CALLS == [("add", (1, 2))] and not listener.crashed
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("ERROR", "adopting the journals of dead listeners stopped: "
            "RuntimeError('a helper broke')") in said, said
    assert ("WARNING", "quarantine process not started ahead: a helper broke") in said, said


def test_a_loop_that_fails_as_the_listener_stops_does_not_make_it_a_crash(
        server: fakeredis.FakeServer) -> None:
    """Once a listener is stopping, its loops are cancelled: one that fails on its way
    out (a lost connection as it closes) leaves the stop a stop, exit status 0, not a
    crash that its supervisor would answer by starting it again."""

    async def scenario() -> Listener:
        listener = make_listener(server)

        async def fails_when_cancelled() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RuntimeError("failed on its way out") from None

        listener.lanes[0].trimmer.run = fails_when_cancelled  # type: ignore[method-assign]
        await burst(listener)
        return listener

    listener = asyncio.run(scenario())
    assert not listener.crashed and not listener.aborted
