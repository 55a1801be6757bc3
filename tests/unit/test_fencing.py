"""The fence (invariant 12), without processes: a run starts only while its lease is known
to hold. HeldRuns says so from the renewals it saw (a monotonic clock, patched here); a
thread about to call a function next in line asks it first; the executor revalidates a
stale run in Redis and starts it only if the lease is still the listener's."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import multiprocessing
import pickle
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

import timers
from tests.unit.test_next_in_line_runs import Log, until
from timers.listener import leases
from timers.listener.calling.context import TimerContext
from timers.listener.calling.runner import Runner, Turn
from timers.listener.leases import HeldRuns, fresh_in, renewal_timeout, sync_twin
from timers.listener.quarantine import child as quarantine_child
from timers.model.runs import Outcome, Run
from timers.store import cluster


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(leases.time, "monotonic", clock)
    return clock


def test_a_held_run_is_fresh_until_a_stall_outlasts_its_renewals(clock: Clock) -> None:
    held = HeldRuns(lease=2.0)
    held.hold("7", "t")
    assert held.fresh("7")  # a claim's reply: fresh for half a lease
    clock.now += 0.85
    assert not held.fresh("7")  # no renewal came: not known to hold any more
    held.confirm(["7"], sent=clock.now)
    assert held.fresh("7")
    clock.now += 4.0  # the process was paused past its lease
    assert not held.fresh("7")
    assert not held.fresh("8")  # never held


def test_a_released_or_lost_run_is_never_fresh(clock: Clock) -> None:
    held = HeldRuns(lease=2.0)
    held.hold("7", "t")
    held.hold("8", "u")
    held.release(["7"])
    assert held.drop_lost("8") == "u"
    held.confirm(["7", "8"], sent=clock.now)  # a renewal's reply read after the release
    assert not held.fresh("7") and not held.fresh("8")


def test_a_function_whose_lease_is_stale_in_its_thread_is_not_called() -> None:
    log = Log()
    fresh = threading.Event()

    async def main() -> None:
        runner, turn = Runner(1), Turn()
        first = asyncio.create_task(runner.call(log.task("a", block=True), [], turn=turn))
        await until(lambda: log.order() == ["start a"])
        following = asyncio.create_task(
            runner.call(log.task("b"), [], after=turn, fence=fresh.is_set))
        await until(lambda: turn.job is not None and turn.job.then is not None)  # b chained
        log.gate.set()  # a returns while b's lease is not known to hold (a stall)
        outcomes = await asyncio.gather(first, following)
        assert outcomes[0].ok and outcomes[1].kind == "stale"

    asyncio.run(main())
    assert log.order() == ["start a", "end a"]  # b was never called


def test_a_run_next_in_line_waits_for_the_run_before_it_that_was_stale_in_its_thread(
) -> None:
    """A run found stale in its thread is not over: it is revalidated and called again,
    so the run next in line after it starts only once that call returns (it started the
    moment the stale check failed, and the run before it ran beside it, after it: a key's
    order broken on Cluster through a failover). Given up (taken over), it lets the run
    next in line go, which asks its own fence."""
    log, busy, held = Log(), threading.Event(), threading.Event()

    def blocker() -> None:
        assert busy.wait(10)

    async def main(give_up: bool) -> None:
        runner, turn = Runner(1), Turn()
        hold = asyncio.create_task(runner.call(blocker, []))  # the one thread is busy
        first = asyncio.create_task(runner.call(log.task("a"), [], turn=turn, fence=held.is_set))
        await until(lambda: turn.job is not None)
        following = asyncio.create_task(runner.call(log.task("b"), [], after=turn))
        await until(lambda: turn.job is not None and turn.job.then is not None)  # b chained
        busy.set()  # a's thread finds its lease not known to hold: a is not called
        assert (await first).kind == "stale"
        await hold
        # nor b: it follows a, which has not run yet (still chained, not started)
        assert turn.job.then is not None and turn.job.then.started is None
        assert log.order() == []
        if give_up:
            runner.let_follower_go(turn)
        else:
            held.set()  # revalidated: a runs now, in a new call
            assert (await runner.call(log.task("a"), [], turn=turn, fence=held.is_set)).ok
        assert (await following).ok

    asyncio.run(main(False))
    assert log.order() == ["start a", "end a", "start b", "end b"]
    log.lines.clear()
    busy.clear()
    held.clear()
    asyncio.run(main(True))
    assert log.order() == ["start b", "end b"]


def test_a_coroutine_whose_lease_is_stale_is_not_started() -> None:
    started: list[str] = []

    async def task() -> None:
        started.append("ran")

    async def main() -> None:
        outcome = await Runner(1).call(task, [], fence=lambda: False)
        assert outcome.kind == "stale"

    asyncio.run(main())
    assert started == []


def test_a_run_in_another_process_sees_its_lease_as_the_listener_does(clock: Clock) -> None:
    """The cell a quarantine child reads (HeldRuns.share) holds the lease's end as the
    listener knows it: fresh after a claim and each renewal, stale after a stall, and 0
    the moment the run is lost (taken over) or released."""
    held = HeldRuns(lease=2.0)
    held.hold("7", "t")
    cell, other = ctypes.c_double(), ctypes.c_double()
    held.share("7", cell)
    assert fresh_in(cell, held.margin) == held.fresh("7") is True
    clock.now += 0.85  # no renewal came
    assert fresh_in(cell, held.margin) == held.fresh("7") is False
    held.confirm(["7"], sent=clock.now)
    assert fresh_in(cell, held.margin)
    clock.now += 1.5
    held.confirm(["7"], sent=clock.now)  # every renewal moves it on
    assert fresh_in(cell, held.margin)
    assert held.drop_lost("7") == "t"  # a renewal found it taken over
    assert cell.value == 0 and not fresh_in(cell, held.margin)
    held.hold("8", "u")
    held.share("8", other)
    held.release(["8"])
    assert other.value == 0


NOTES: list[tuple[int, bool]] = []
GO = threading.Event()


def ledger_task() -> None:
    """A task that notes its fencing token and still_held() at its start, waits for
    :data:`GO`, and notes still_held() again (in :data:`NOTES`)."""
    timer = timers.current()
    NOTES.append((timer.fencing_token, timer.still_held()))
    GO.wait(10)
    NOTES.append((timer.fencing_token, timer.still_held()))


CONTEXT = TimerContext(id="t", task="fenced.command", attempt=2,
                       due=datetime(2026, 1, 1, tzinfo=UTC),
                       original_due=datetime(2026, 1, 1, tzinfo=UTC), lateness=0.0,
                       fencing_token=41)


def in_child(cell: ctypes.c_double, margin: float) -> tuple[list[str], asyncio.Future[Outcome]]:
    """What a quarantine child does with a run (``quarantine_child.run_in_child``, without a
    process: the task resolved by reference), the lease shared in ``cell``."""
    said: list[str] = []
    NOTES.clear()
    return said, asyncio.ensure_future(quarantine_child.run_in_child(
        "tests", None, "t", pickle.dumps(ledger_task), "[]", lambda: said.append("started"),
        CONTEXT, functools.partial(fresh_in, cell, margin)))


def test_a_quarantine_child_notes_a_returned_task_aside_before_it_says_so(
        tmp_path: Path) -> None:
    """Invariant 8 in the child's process: its task returned, the child notes it beside
    its listener's journal (``note_aside``) before the outcome goes back, so a rerun finds
    it while the listener is paused or after it died with the outcome unread; a task that
    did not return (here: stale, not called) notes nothing."""
    aside = (str(tmp_path / "journal.endings.q41"), b"O 0 41 1000 t\n")

    async def child(margin: float) -> Outcome:
        NOTES.clear()
        return await quarantine_child.run_in_child(
            "tests", None, "t", pickle.dumps(ledger_task), "[]", lambda: None, CONTEXT,
            functools.partial(fresh_in, ctypes.c_double(time.monotonic() + 30), margin),
            aside=aside)

    assert asyncio.run(child(60.0)).kind == "stale"
    assert not Path(aside[0]).exists()
    assert asyncio.run(child(0.2)).ok
    assert Path(aside[0]).read_bytes() == aside[1]


def test_a_quarantine_child_starts_no_task_whose_lease_is_stale() -> None:
    """The listener stalled (or the run was taken over) after it handed the rerun to its
    child: the child checks the shared lease right before the task's code and calls
    nothing (before, a rerun that waited for its loading turn started with an older token
    than a rerun started elsewhere meanwhile)."""
    GO.set()

    async def main() -> Outcome:
        _, outcome = in_child(ctypes.c_double(time.monotonic() + 0.1), 0.2)
        return await outcome

    assert asyncio.run(main()).kind == "stale"
    assert NOTES == []


def test_still_held_in_a_quarantine_child_turns_false_when_its_lease_does() -> None:
    """A child started under a fresh lease; its listener is then stopped (no renewal: the
    lease's end passes) or learns the run was taken over (0): still_held() says so in
    the child, as it does in a thread of the listener (before, always True there)."""
    for stale in (0.0, time.monotonic() - 1):
        GO.clear()
        cell = ctypes.c_double(time.monotonic() + 30)

        async def main() -> Outcome:
            said, outcome = in_child(cell, 0.2)  # noqa: B023 (run within the iteration)
            await until(lambda: len(NOTES) == 1)
            assert said == ["started"]
            cell.value = stale  # noqa: B023
            GO.set()
            return await outcome

        assert asyncio.run(main()).ok
        assert NOTES == [(41, True), (41, False)]


class FailingOver:
    """Scripts whose server cannot be reached for the first ``down`` renewals (a failover),
    then answers that the run is held (``lost``: that it was taken over)."""

    def __init__(self, down: int, lost: bool = False) -> None:
        self.down, self.lost, self.asked = down, lost, 0

    async def renew(self, lease_ms: int, tokens: list[str]) -> list[str]:
        self.asked += 1
        if self.asked <= self.down:
            raise redis.ConnectionError("Connection refused")
        return list(tokens) if self.lost else []


@pytest.mark.parametrize("lost", [False, True])
def test_a_stale_run_is_revalidated_once_redis_answers_again_through_a_failover(
        lost: bool) -> None:
    """While Redis cannot be reached, the fence asks again: nobody can take the run over
    meanwhile. It answered "not held" at once before, and the run, still held next in
    line on its key in Redis, was dropped: the key's next timer started before it (4 FIFO
    breaks in a 30-minute Cluster chaos run, each through a primary's failover)."""
    scripts = FailingOver(down=3, lost=lost)
    fence = leases.Fence(HeldRuns(lease=2.0), scripts, 2.0)  # type: ignore[arg-type]
    run = Run("1", "7", "", 0, 0, "sweep")
    assert asyncio.run(fence.revalidate(run)) is not lost
    assert scripts.asked == 4


class Leases:
    """Scripts over a map of leases, as ``renew.lua`` and a claim's recovery treat them:
    a renewal extends every lease still present (lapsed or not); a recovery takes over
    those lapsed by ``now``."""

    def __init__(self, **deadlines: float) -> None:
        self.deadlines, self.now = dict(deadlines), 0.0

    async def renew(self, lease_ms: int, tokens: list[str]) -> list[str]:
        for token in tokens:
            if token in self.deadlines:
                self.deadlines[token] = self.now + lease_ms / 1000
        return [t for t in tokens if t not in self.deadlines]

    def recover(self) -> list[str]:
        lapsed = [t for t, until in self.deadlines.items() if until <= self.now]
        for token in lapsed:
            del self.deadlines[token]
        return lapsed


def test_a_run_next_in_line_is_revalidated_with_the_run_before_it() -> None:
    """A stall lapses both leases: the run whose function returned (its ending not written
    yet) and the run next in line after it. Revalidating the second alone kept it and let
    a claim rerun the first a moment later, which took the second back (T5) after it had
    started: 2 runs of a key at once in a 6-minute Cluster chaos run."""
    held = HeldRuns(lease=2.0)
    held.hold("7", "before")
    held.hold("8", "next")
    scripts = Leases(**{"7": 2.0, "8": 2.0})
    scripts.now = 5.0  # renewals failed through a failover
    fence = leases.Fence(held, scripts, 2.0)  # type: ignore[arg-type]
    assert asyncio.run(fence.revalidate(Run("8", "n", "", 0, 0, "next", follows="7")))
    assert scripts.recover() == [], "the run before it was left to lapse"
    held.release(["7"])  # its ending is written: the run next in line alone is asked
    assert asyncio.run(fence.revalidate(Run("8", "n", "", 0, 0, "next", follows="7")))


def test_a_renewal_call_on_a_cluster_gives_up_within_a_third_of_the_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease keeper's sync Cluster client makes one attempt a call, each read and
    connect bounded by a third of the lease: with redis-py's default of 10 attempts, a
    renewal kept retrying a killed primary past the lease and then succeeded, so nothing
    failed or was logged while the leases lapsed and another listener ran the timers again
    (the chaos checker's Cluster run, a primary killed)."""
    made: dict[str, Any] = {}

    def sync_cluster(**kwargs: Any) -> object:
        made.update(kwargs)
        return object()

    monkeypatch.setattr(cluster, "_SyncCluster", sync_cluster)
    client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=7000)  # not connected
    sync_twin(client, renewal_timeout(2.0))
    assert made["cluster_error_retry_attempts"] == 1
    assert made["socket_timeout"] == made["socket_connect_timeout"] == pytest.approx(2 / 3)


def test_the_lease_keeper_renews_on_the_listeners_own_server_with_its_settings() -> None:
    """The lease keeper's sync client (a thread of its own renews the leases) talks to the
    server, database and user the listener's asyncio client does, over TLS when it does:
    a twin that dropped them renewed on localhost:6379, or not at all, so every lease
    lapsed and other listeners ran the timers again."""
    client = redis.asyncio.Redis(host="10.9.8.7", port=7001, db=3, username="app",
                                 password="secret", ssl=True, ssl_cert_reqs="none",
                                 client_name="listener-1")  # not connected
    twin = sync_twin(client, renewal_timeout(3.0))
    settings = twin.connection_pool.connection_kwargs
    assert {k: settings.get(k) for k in ("host", "port", "db", "username", "password",
                                         "client_name", "ssl_cert_reqs")} == {
        "host": "10.9.8.7", "port": 7001, "db": 3, "username": "app", "password": "secret",
        "client_name": "listener-1", "ssl_cert_reqs": "none"}
    assert twin.connection_pool.connection_class is redis.SSLConnection
    assert settings["socket_timeout"] == pytest.approx(1.0)
    twin.close()


@pytest.mark.parametrize("window", [-0.001, 30.0])
def test_a_quarantine_child_given_the_word_past_its_start_window_starts_nothing(
        window: float) -> None:
    """A rate's rerun in a child: the listener's word to start carries the start window
    its gate gave (``(go, start_by)`` down the pipe); a child that reads it too late (a
    loaded machine) calls nothing, as a thread of the listener would not."""
    GO.set()
    word_in, word_out = multiprocessing.Pipe(duplex=False)
    loaded_in, loaded_out = multiprocessing.Pipe(duplex=False)
    word_out.send((quarantine_child.GO, time.monotonic() + window))
    go = quarantine_child._waits_for_word(loaded_out, word_in)
    assert loaded_in.recv() == quarantine_child.LOADED_WORD and go.start

    async def main() -> Outcome:
        NOTES.clear()
        return await quarantine_child.run_in_child(
            "tests", None, "t", pickle.dumps(ledger_task), "[]", lambda: None, CONTEXT,
            functools.partial(fresh_in, ctypes.c_double(time.monotonic() + 30), 0.2),
            lambda: go)

    outcome = asyncio.run(main())
    if window < 0:
        assert outcome.kind == "late" and NOTES == []
    else:
        assert outcome.ok and NOTES == [(41, True), (41, True)]
    word_out.send("no")  # held by its gate: the child leaves it
    assert not quarantine_child._waits_for_word(loaded_out, word_in).start
