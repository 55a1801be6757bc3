"""The listener's parts, each on its own: the event classifier, the executor, the ending
writer. No part's private state is read; each is driven through what it offers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

from tests.unit.sample_tasks import mod
from timers import Timers
from timers.exceptions import TaskRefused
from timers.listener.calling.runner import LATE, Runner
from timers.listener.cron_hook import RecurrenceHook
from timers.listener.endings.ending import Ending, Executed
from timers.listener.endings.history import HistoryPolicy
from timers.listener.endings.writer import EndingWriter
from timers.listener.executor import Executor
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.finding.events import (
    Channels,
    Due,
    EventHub,
    EventSource,
    Rejected,
    Wake,
    classify,
)
from timers.listener.flow.gate import FREE, Admission
from timers.listener.flow.turns import Turns
from timers.listener.leases import HeldRuns
from timers.listener.retrying import Outage
from timers.model.clock import ManualClock
from timers.model.cron import State
from timers.model.encoding import Record, entry_text
from timers.model.history import MinuteSlot, bucket_of
from timers.model.keys import Keyspace
from timers.model.policy import task
from timers.model.runs import Outcome, Run, RunFacts
from timers.model.wire import EndingKind, FailureRecord, Option
from timers.ops.fleet import FleetView, Peer
from timers.store.script_rows import Taker
from timers.store.scripts import Scripts

KEYS = Keyspace()
CHANNELS = Channels.of(KEYS, 0)
REDIS_NOW_MS = 5_000_000.0
"""The Redis clock in these tests: 1970, while the local wall clock says today."""



# -- the event classifier ----------------------------------------------------------------


def refuse_unknown(name: str) -> object:
    if name != "mod.add":
        raise TaskRefused(f"no task {name}")
    return mod.add


def message(channel: bytes, data: Any, kind: str = "message") -> dict[str, Any]:
    return {"type": kind, "pattern": None, "channel": channel, "data": data}


def test_classify_names_what_each_message_means() -> None:
    key = b"timers:" + entry_text("t1", Record("mod.add", [1]).encode()).encode()
    refused = b"timers:" + entry_text("t2", Record("os.system", ["x"]).encode()).encode()
    expired = CHANNELS.expired
    assert classify(message(expired, key), CHANNELS, refuse_unknown) == Due("t1")
    rejected = classify(message(expired, refused), CHANNELS, refuse_unknown)
    assert isinstance(rejected, Rejected) and rejected.escaped_id == "t2"
    bad = classify(message(expired, b"timers:%zz"), CHANNELS, refuse_unknown)
    assert isinstance(bad, Rejected) and bad.escaped_id is None
    assert classify(message(CHANNELS.wake, b"123.5"), CHANNELS, refuse_unknown) == Wake(123.5)
    assert classify(message(CHANNELS.wake, b"nan"), CHANNELS, refuse_unknown) == Wake(None)
    assert classify(message(expired, b"session:1"), CHANNELS, refuse_unknown) is None
    assert classify(message(b"other", key), CHANNELS, refuse_unknown) is None
    assert classify(message(expired, 1, "subscribe"), CHANNELS, refuse_unknown) is None



def test_while_the_sweep_is_behind_expired_events_are_left_to_it_and_wakes_still_count(
) -> None:
    key = b"timers:" + entry_text("t1", Record("mod.add", [1]).encode()).encode()
    tracker = DueTracker(ManualClock())
    pokes: list[None] = []
    source = EventSource(fakeredis.FakeAsyncRedis(), CHANNELS, KEYS, refuse_unknown, tracker,
                         lambda: pokes.append(None), lambda rejected: None, asyncio.Event(),
                         outage=Outage(), hub=EventHub())
    tracker.backlogged = True  # the last claim was full: the due index has more due
    source.handle(message(CHANNELS.expired, key))
    assert source.take(10) == [] and pokes == []
    source.handle(message(CHANNELS.wake, b"123"))
    assert tracker.next_due_ms == 123 and len(pokes) == 1
    tracker.backlogged = False  # caught up: an event may be the only news of a due timer
    source.handle(message(CHANNELS.expired, key))
    assert source.take(10) == ["t1"] and len(pokes) == 2


def test_a_wake_that_is_no_due_time_is_ignored_quietly(caplog: pytest.LogCaptureFixture,
                                                       ) -> None:
    """During a rolling upgrade an older release's listener may still publish "x:<token>"
    on the wake channel (it asked a run next in line back): this release ignores it, with
    one debug line, and goes on reading the channel."""
    tracker = DueTracker(ManualClock())
    pokes: list[None] = []
    source = EventSource(fakeredis.FakeAsyncRedis(), CHANNELS, KEYS, refuse_unknown, tracker,
                         lambda: pokes.append(None), lambda rejected: None, asyncio.Event(),
                         outage=Outage(), hub=EventHub())
    with caplog.at_level("DEBUG", logger="timers"):
        assert classify(message(CHANNELS.wake, b"x:42"), CHANNELS, refuse_unknown) is None
        caplog.clear()
        source.handle(message(CHANNELS.wake, b"x:42"))
    assert pokes == [] and source.take(10) == [] and tracker.next_due_ms is None
    assert [record.levelname for record in caplog.records] == ["DEBUG"]
    source.handle(message(CHANNELS.wake, b"123"))  # the next wake still counts
    assert tracker.next_due_ms == 123 and len(pokes) == 1


# -- the executor ------------------------------------------------------------------------


class NoRecurrences:
    async def before_run(self, run: Run, record: Record, started_ms: float) -> Outcome | None:
        raise AssertionError("not a recurrence")

    async def after_run(self, run: Run, record: Record, outcome: Outcome) -> None:
        raise AssertionError("not a recurrence")


class NoQuarantine:
    async def run(self, *args: Any) -> Outcome:
        raise AssertionError("no run here is suspect")


class NoSleep:
    async def sleep_until(self, monotonic: float) -> None:
        pass


class FreeGate:
    """A flow gate that lets every run go."""

    async def admit(self, run: Run, record: Record, policy: Any) -> Admission:
        return FREE


class Held:
    """A fence under which every lease holds."""

    def fresh(self, token: str) -> bool:
        return True

    async def revalidate(self, run: Run) -> bool:
        return True


class NoPeers:
    """No other live listener of the prefix."""

    async def runners(self, task: str, group: str) -> tuple[list[Peer], FleetView]:
        return [], FleetView()

    def refusal(self, view: FleetView) -> str:
        return view.describe(exclude="me")


@task(retries=2)
def flaky() -> None:
    raise ValueError("flaky")


@task(group="video")
def encode(*_: Any) -> None:
    """A task of the video group: a timer in another group moves there, not run here."""
    mod.CALLS.append(("encode", ()))


TASKS: dict[str, Callable[..., Any]] = {"mod.add": mod.add, "mod.boom": mod.boom,
                                        "flaky": flaky, "media.encode": encode}


def resolve(name: str) -> Callable[..., Any]:
    if name not in TASKS:
        raise TaskRefused(f"no task {name}")
    return TASKS[name]


def tracker_on_redis_clock() -> DueTracker:
    clock = ManualClock()
    tracker = DueTracker(clock)
    tracker.observe_time(REDIS_NOW_MS * 1000, clock.now, clock.now)
    return tracker


def executor_of(runner: Runner, quarantine: Any = None, *, turns: Turns | None = None,
                flow: Any = None, fence: Any = None, peers: Any = None,
                stopping: asyncio.Event | None = None, name: str = "",
                recurrences: Any = None) -> Executor:
    """An executor of :data:`TASKS` on the Redis clock of these tests; unless given, no
    run is suspect, the flow gate lets every run go, every lease holds and no other
    listener is live."""
    return Executor(resolve, runner, NoQuarantine() if quarantine is None else quarantine,
                    NoRecurrences() if recurrences is None else recurrences,
                    tracker_on_redis_clock(), NoSleep(),
                    flow=FreeGate() if flow is None else flow, name=name,
                    turns=Turns() if turns is None else turns,
                    fence=Held() if fence is None else fence,
                    peers=NoPeers() if peers is None else peers,
                    stopping=asyncio.Event() if stopping is None else stopping)


def execute(task_name: str, args: Any, due_ms: float = REDIS_NOW_MS,
            options: dict[str, str] | None = None, stopped: bool = False) -> Ending:
    record = Record(task_name, args, options or {}).encode()

    async def scenario() -> Ending:
        runner = Runner(2)
        stopping = asyncio.Event()
        if stopped:
            stopping.set()
        try:
            executor = executor_of(runner, stopping=stopping)
            done = await executor.execute(Run("7", "t", record, round(due_ms), 0, "sweep"))
        finally:
            runner.shutdown()
        assert (done.report is None) == stopped
        assert done.ending is not None
        return done.ending

    return asyncio.run(scenario())


def test_an_occurrence_without_overlap_frees_its_slot_as_its_run_ends(
    fake: fakeredis.FakeRedis
) -> None:
    """A recurrence with ``overlap=False``: its run takes the recurrence's slot before its
    task is called, and frees it once it ended, whatever ended it; else every later
    occurrence is skipped as overlapping a run long over."""
    with Timers(fake) as producer:
        producer.every("slow", "mod.add", [1, 2], interval=60, overlap=False)
    server = fake.connection_pool.connection_kwargs["server"]

    async def scenario() -> tuple[str, str]:
        client = fakeredis.FakeAsyncRedis(server=server)
        runner = Runner(2)
        try:
            executor = executor_of(runner, recurrences=RecurrenceHook(client, Keyspace()))
            taken = await Scripts(client, Keyspace()).claim(
                limit=1, lease_ms=30_000, horizon_ms=10 * 86_400_000, listener_id="me")
            run = Run.parse(*taken[3:6])
            done = await executor.execute(run)
        finally:
            runner.shutdown()
            await client.aclose()
        assert done.ending is not None
        state = fake.hget(Keyspace().recurrence_states, "slow")
        return done.ending.kind, State.decode(state).run

    kind, holder = asyncio.run(scenario())
    assert kind == EndingKind.OK
    assert fake.zcard(Keyspace().due) == 1  # its next occurrence, scheduled as it ran
    assert holder == ""  # the slot is free: the next occurrence runs


def test_a_run_not_started_when_its_listener_stops_is_handed_back_unstarted() -> None:
    """A loaded listener claims runs a few ms ahead; the stop comes before their due time:
    they go back to run elsewhere, never started here (started, then handed back part-run
    at the shutdown timeout, they ran twice)."""
    calls = len(mod.CALLS)
    ending = execute("mod.add", [1, 2], stopped=True)
    assert (ending.token, ending.kind) == ("7", EndingKind.RELEASE)
    assert len(mod.CALLS) == calls


def test_a_timer_of_another_group_than_its_task_declares_moves_there_unrun() -> None:
    """A timer scheduled in the default group for a task of the video group is not run by
    a listener of the default group: it moves to the video group, uncounted; moved as
    often as it may, it waits in its group (the releases disagree) and is still not run."""
    calls = len(mod.CALLS)
    moved = execute("media.encode", [1])
    assert moved.kind is EndingKind.MOVE and ";g=video" in moved.retry_entry
    waits = execute("media.encode", [1], options={Option.GROUP_MOVES: "99"})
    assert waits.kind is EndingKind.WAIT
    assert len(mod.CALLS) == calls


def test_the_executor_ends_each_run_as_its_task_went() -> None:
    ok = execute("mod.add", [1, 2])
    assert (ok.token, ok.kind, ok.run_of) == ("7", EndingKind.OK, ("t", round(REDIS_NOW_MS)))
    raised = execute("mod.boom", ["bang"])
    assert raised.kind is EndingKind.FAIL and raised.failure is not None
    assert (raised.failure.kind, raised.failure.error_type) == ("error", "ValueError")
    bad_args = execute("mod.add", {"nope": 1})
    assert bad_args.failure is not None and bad_args.failure.kind == "bad_args"
    refused = execute("os.system", ["rm"])
    assert refused.failure is not None and refused.failure.kind == "refused"
    missed = execute("mod.add", [1], due_ms=REDIS_NOW_MS - 5000,
                     options={Option.MAX_LATENESS: "1000"})
    assert missed.failure is not None and missed.failure.kind == "missed"
    assert mod.CALLS == [("add", (1, 2))], "only the good run called its task"
    retry = execute("flaky", [])
    assert (retry.kind, retry.retry_delay_ms > 0) == (EndingKind.RETRY, True)
    assert f";{Option.ATTEMPTS}=1;" in retry.retry_entry + ";"


def test_failure_times_come_from_the_redis_clock_not_the_local_one() -> None:
    """Issue 10 bug 5: the listener's wall clock says today, Redis says 1970."""
    dead = execute("mod.boom", ["bang"])
    assert dead.failure is not None
    assert dead.failure.failed_at == dead.failure.first_failure == round(REDIS_NOW_MS)
    retry = execute("flaky", [])
    assert f";{Option.FIRST_FAILURE}={round(REDIS_NOW_MS)}" in retry.retry_entry


class HoldsFirst:
    """A flow gate that holds run "1" back with ``status`` and lets the others go."""

    def __init__(self, status: str) -> None:
        self.status = status

    async def admit(self, run: Run, record: Record, policy: Any) -> Admission:
        return Admission(Outcome("held", self.status, "held") if run.token == "1" else None)


def run_with_next_in_line(flow: Any) -> tuple[Executed, Executed]:
    """Execute a keyed run handed over holding its slot (token "1") and the run next in
    line after it ("2"), both of ``mod.add``, through ``flow``."""
    record = Record("mod.add", [1, 2], {Option.KEY: "k"}).encode()

    async def scenario() -> tuple[Executed, Executed]:
        runner, turns = Runner(2), Turns()
        try:
            executor = executor_of(runner, turns=turns, flow=flow)
            first = Run("1", "a", record, round(REDIS_NOW_MS), 0, "handoff")
            following = Run("2", "b", record, round(REDIS_NOW_MS), 0, "next", follows="1")
            turns.start(first)
            turns.start(following)
            after = asyncio.create_task(executor.execute(following))
            done = await executor.execute(first)
            turns.end("1")  # as the lane does once the run's task is done
            return done, await after
        finally:
            runner.shutdown()

    return asyncio.run(scenario())


@pytest.mark.parametrize(("status", "ending"), [("wait", None), ("replaced", None),
                                                ("lost", "release")])
def test_a_run_next_in_line_after_a_run_its_gate_held_back_does_not_start(
        status: str, ending: str | None) -> None:
    """A rated run handed over holding its key's slot, held back by its gate for its rate:
    gate.lua took the run next in line after it back into the key's queue (the key's later
    timers wait behind a timer waiting for its rate), so the listener does not start that
    one and writes nothing for it (before: it started the moment the held run ended its
    turn). Held for a lost lease, nothing was taken back: it is handed back, unstarted (it
    started before, holding no slot)."""
    calls = len(mod.CALLS)
    held, after = run_with_next_in_line(HoldsFirst(status))
    assert held.ending is None and after.report is None
    assert (after.ending.kind.value if after.ending else None) == ending
    assert len(mod.CALLS) == calls, "the run next in line never called its task"


class StartsSeen:
    """Recurrence steps that note when each run's step was told it started."""

    def __init__(self) -> None:
        self.started: list[float] = []

    async def before_run(self, run: Run, record: Record, started_ms: float) -> Outcome | None:
        self.started.append(started_ms)
        return None

    async def after_run(self, run: Run, record: Record, outcome: Outcome) -> None:
        pass


@pytest.mark.parametrize("waits_for", ["max lateness", "recurrence"])
def test_a_run_next_in_line_that_waited_for_the_run_before_it_starts_from_then(
        waits_for: str) -> None:
    """A run next in line with something to decide at its start (its max lateness; a
    recurrence's plan of its next occurrence, which weighs its lateness) does not start in
    the thread of the run before it: it waits for that run to end, and its start, its
    lateness and its report count from then, not from its claim."""
    first_record = Record("slow", []).encode()
    options = ({Option.KEY: "k", Option.MAX_LATENESS: "60000"} if waits_for == "max lateness"
               else {Option.KEY: "k", Option.RECURRENCE: "every"})
    record = Record("mod.add", [1, 2], options).encode()
    steps = StartsSeen()

    async def scenario() -> Executed:
        runner, turns = Runner(2), Turns()
        try:
            executor = executor_of(runner, turns=turns, recurrences=steps)
            clock = executor.tracker.clock
            TASKS["slow"] = lambda: clock.advance(5.0)  # type: ignore[attr-defined]
            first = Run("1", "a", first_record, round(REDIS_NOW_MS), 0, "handoff")
            following = Run("2", "b", record, round(REDIS_NOW_MS), 0, "next", follows="1")
            turns.start(first)
            turns.start(following)
            after = asyncio.create_task(executor.execute(following))
            await executor.execute(first)
            turns.end("1")  # as the lane does once the run's task is done
            return await after
        finally:
            runner.shutdown()
            TASKS.pop("slow", None)

    done = asyncio.run(scenario())
    assert done.report is not None and done.report.outcome.kind == "ok"
    assert done.report.started_ms == pytest.approx(REDIS_NOW_MS + 5000, abs=1)
    if waits_for == "recurrence":
        assert steps.started == [pytest.approx(REDIS_NOW_MS + 5000, abs=1)]


class Quarantined:
    """Quarantine that notes each start and end; the first run it is given waits for
    ``release`` (a rerun whose child runs a while)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.release = asyncio.Event()

    async def run(self, timer_id: str, *args: Any) -> Outcome:
        first = not self.order
        self.order.append(f"start {timer_id}")
        if first:
            await self.release.wait()
        self.order.append(f"end {timer_id}")
        return Outcome("ok", "", "")


@pytest.mark.parametrize("first_reruns", [0, 1])
def test_a_rerun_next_in_line_starts_in_quarantine_only_once_the_run_before_it_ended(
        first_reruns: int) -> None:
    """A key's waiting timers that were reruns (their listener died holding them) handed
    over as a run holding the key's slot and the run next in line after it: the second
    runs in quarantine (a child process), and starts only once the first has ended, as
    any run next in line (before, it went to its quarantine child at once: two commands
    of one device at once on a 3-primary cluster after a listener was killed or paused,
    tests/integration/test_cluster_limits.py)."""
    record = Record("mod.add", [1, 2], {Option.KEY: "k"}).encode()
    quarantine = Quarantined()
    blocker = asyncio.Event()

    async def scenario() -> list[str]:
        runner, turns = Runner(2), Turns()
        try:
            executor = executor_of(runner, quarantine, turns=turns)
            loop = asyncio.get_running_loop()
            if not first_reruns:  # the first runs in a thread, held until released
                quarantine.order.append("start 1")
                TASKS["held"] = lambda: asyncio.run_coroutine_threadsafe(
                    blocker.wait(), loop).result(10)
            first = Run("1", "1", Record("held", []).encode() if not first_reruns
                        else record, round(REDIS_NOW_MS), first_reruns, "handoff")
            following = Run("2", "2", record, round(REDIS_NOW_MS), 1, "next", follows="1")
            turns.start(first)
            turns.start(following)
            before = asyncio.create_task(executor.execute(first))
            after = asyncio.create_task(executor.execute(following))
            await asyncio.sleep(0.1)
            seen = list(quarantine.order)
            quarantine.release.set()
            blocker.set()
            assert (await before).ending is not None
            if not first_reruns:
                quarantine.order.append("end 1")
            turns.end("1")  # as the lane does once the run's task is done
            done = await asyncio.wait_for(after, 10)
            assert done.ending is not None and done.ending.kind is EndingKind.OK
            return seen
        finally:
            TASKS.pop("held", None)
            runner.shutdown()

    seen = asyncio.run(scenario())
    assert seen == ["start 1"], "the rerun next in line started while the run before it ran"
    assert quarantine.order == ["start 1", "end 1", "start 2", "end 2"]


class StaleChild:
    """Quarantine whose first child finds the run's lease stale (the listener stalled
    after handing it over) and starts nothing; later children run it."""

    def __init__(self) -> None:
        self.children = 0

    async def run(self, timer_id: str, token: str, *args: Any) -> Outcome:
        self.children += 1
        return Outcome("stale", "", "not held") if self.children == 1 else Outcome("ok", "", "")


class Revalidated:
    """A fence whose local check passes before the child, and whose Redis check says
    ``held``."""

    def __init__(self, held: bool) -> None:
        self.held = held
        self.asked = 0

    def fresh(self, token: str) -> bool:
        return True

    async def revalidate(self, run: Run) -> bool:
        self.asked += 1
        return self.held


def execute_fenced(run: Run, quarantine: Any, fence: Revalidated) -> Executed:
    """``run`` through an executor of its own with this quarantine and fence."""
    async def scenario() -> Executed:
        runner = Runner(1)
        try:
            executor = executor_of(runner, quarantine, fence=fence)
            return await executor.execute(run)
        finally:
            runner.shutdown()

    return asyncio.run(scenario())

@pytest.mark.parametrize("held", [False, True])
def test_a_rerun_whose_child_found_its_lease_stale_is_revalidated_before_it_starts(
        held: bool) -> None:
    """The quarantine child checks the lease right before the task's code; when it was
    not known to hold there, the listener asks Redis, as for a stale start in a thread:
    taken over, nothing is written (the run is the other listener's now); still held, a
    new child runs it. Before, the child ran it whatever the lease."""
    record = Record("mod.add", [1, 2], {Option.KEY: "k"}).encode()
    quarantine, fence = StaleChild(), Revalidated(held)
    done = execute_fenced(Run("1", "7", record, round(REDIS_NOW_MS), 1, "recovered"),
                          quarantine, fence)
    assert fence.asked == 1
    if held:
        assert quarantine.children == 2
        assert done.ending is not None and done.ending.kind is EndingKind.OK
    else:
        assert quarantine.children == 1
        assert done.ending is None and done.report is None, "taken over: nothing written"


class StaleInThread(Revalidated):
    """A fence found not fresh the first time a task's thread asks it, right before the
    call (a stall there), and fresh wherever else it is asked (the loop's own checks, the
    thread's later ones); Redis says ``held``."""

    def __init__(self, held: bool) -> None:
        super().__init__(held)
        self.stalled = False

    def fresh(self, token: str) -> bool:
        if threading.current_thread() is threading.main_thread() or self.stalled:
            return True
        self.stalled = True
        return False


@pytest.mark.parametrize("held", [False, True])
def test_a_run_whose_thread_found_its_lease_stale_runs_once_if_still_held_else_not(
        held: bool) -> None:
    """The thread checks the lease right before the task's function; not fresh there, the
    listener asks Redis: still held, the function is called once, in a new call, and the
    run ends as it went; taken over, it is never called and nothing is written (the run
    is the other listener's now)."""
    record = Record("mod.add", [1, 2], {}).encode()
    fence = StaleInThread(held)
    done = execute_fenced(Run("1", "7", record, round(REDIS_NOW_MS), 0, "sweep"),
                          NoQuarantine(), fence)
    assert fence.asked == 1
    if held:
        assert mod.CALLS == [("add", (1, 2))]
        assert done.ending is not None and done.ending.kind is EndingKind.OK
    else:
        assert mod.CALLS == []
        assert done.ending is None and done.report is None, "taken over: nothing written"


# -- the ending writer -------------------------------------------------------------------


def _writer(scripts: Scripts, closed: asyncio.Event, *clock: Any) -> EndingWriter:
    """An ending writer of its own, handing nothing over (``clock``: a manual one)."""
    return EndingWriter(scripts, KEYS, 3600, HeldRuns(), closed, *clock,
                        taker=lambda tokens: Taker(), on_handed=lambda runs, n: None,
                        on_written=lambda: None, outage=Outage())


async def _five_claimed(producer: Timers, scripts: Scripts) -> list[Run]:
    """Five timers due now (``t0`` to ``t4``), claimed."""
    for i in range(5):
        producer.schedule("mod.add", [i], in_=0, id=f"t{i}")
    reply = await scripts.claim(limit=10, lease_ms=60_000, horizon_ms=8, listener_id="me")
    items = reply[3:]
    return [Run.parse(*items[i:i + 3]) for i in range(0, len(items), 3)]


def test_the_writer_writes_endings_in_batches_and_forgets_them_once_written(
        server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("timers.listener.endings.writer.MAX_BATCH", 2)
    producer = Timers(fakeredis.FakeRedis(server=server))

    async def scenario() -> tuple[list[int], int]:
        client = fakeredis.FakeAsyncRedis(server=server)
        scripts = Scripts(client, KEYS)
        calls: list[int] = []
        finish = scripts.finish

        async def counted(**kwargs: Any) -> Any:
            calls.append(len(kwargs["endings"]))
            return await finish(**kwargs)

        scripts.finish = counted  # type: ignore[method-assign]
        writer = _writer(scripts, asyncio.Event())
        runs = await _five_claimed(producer, scripts)
        for run in runs:
            writer.add(Ending.of(run, EndingKind.OK))
        assert writer.unwritten_ending_of(runs[0]) is not None
        await writer.flush_remaining(ManualClock())
        assert writer.unwritten_ending_of(runs[0]) is None
        await client.aclose()
        return calls, len(writer)

    calls, left = asyncio.run(scenario())
    assert (calls, left) == ([2, 2, 1], 0)
    stats = producer.stats()
    assert (stats.fired, stats.running, stats.pending) == (5, 0, 0)


def test_in_a_burst_the_writer_lets_a_batch_grow_unless_an_ending_may_free_a_slot(
        server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Endings that come within GATHER of the last call wait out the rest of it and go
    in one call; an ending that may free a flow slot (its key's next run waits for it) is
    written at once, with those queued before it."""
    monkeypatch.setattr("timers.listener.endings.writer.GATHER", 0.5)
    producer = Timers(fakeredis.FakeRedis(server=server))

    async def scenario() -> tuple[list[int], float, float]:
        client = fakeredis.FakeAsyncRedis(server=server)
        scripts = Scripts(client, KEYS)
        calls: list[int] = []
        finish = scripts.finish
        wrote, finished = asyncio.Event(), [0]

        async def counted(**kwargs: Any) -> Any:
            calls.append(len(kwargs["endings"]))
            try:
                return await finish(**kwargs)
            finally:
                finished[0] += 1
                wrote.set()

        async def written(n: int) -> None:
            async with asyncio.timeout(10):
                while finished[0] < n:
                    wrote.clear()
                    await wrote.wait()

        scripts.finish = counted  # type: ignore[method-assign]
        closed = asyncio.Event()
        writer = _writer(scripts, closed, ManualClock())
        runs = await _five_claimed(producer, scripts)
        task = asyncio.create_task(writer.run())
        loop = asyncio.get_running_loop()
        writer.add(Ending.of(runs[0], EndingKind.OK))  # nothing before it: at once
        await written(1)
        start = loop.time()
        writer.add(Ending.of(runs[1], EndingKind.OK))
        await asyncio.sleep(0.05)
        writer.add(Ending.of(runs[2], EndingKind.OK))
        await written(2)
        gathered = loop.time() - start
        start = loop.time()
        writer.add(Ending.of(runs[3], EndingKind.OK))
        await asyncio.sleep(0.05)
        writer.add(Ending.of(runs[4], EndingKind.OK), prompt=True)
        await written(3)
        prompt = loop.time() - start
        closed.set()
        writer.ready.set()
        await asyncio.wait_for(task, 10)
        await client.aclose()
        return calls, gathered, prompt

    calls, gathered, prompt = asyncio.run(scenario())
    assert calls == [1, 2, 2]
    assert gathered >= 0.45
    assert prompt < 0.45
    stats = producer.stats()
    assert (stats.fired, stats.running, stats.pending) == (5, 0, 0)


def test_the_writer_sends_series_and_the_retention_about_once_a_second_and_at_close(
        server: fakeredis.FakeServer) -> None:
    """Between them, a finish call carries only endings and their history records; the
    series it sends sum every run since the last, exactly per task and minute."""
    producer = Timers(fakeredis.FakeRedis(server=server))

    async def scenario() -> list[tuple[int, list[tuple[str, str]], bool]]:
        client = fakeredis.FakeAsyncRedis(server=server)
        scripts = Scripts(client, KEYS)
        clock = ManualClock()
        calls: list[tuple[int, list[tuple[str, str]], bool]] = []
        finish = scripts.finish

        async def seen(**kwargs: Any) -> Any:
            calls.append((len(kwargs["endings"]), list(kwargs["series"]),
                          kwargs["store_retention"]))
            return await finish(**kwargs)

        scripts.finish = seen  # type: ignore[method-assign]
        writer = EndingWriter(scripts, KEYS, 3600, HeldRuns(), asyncio.Event(), clock,
                              taker=lambda tokens: Taker(), on_handed=lambda runs, n: None,
                              on_written=lambda: None, outage=Outage(),
                              history=HistoryPolicy(), listener_id="me")
        for i in range(5):
            producer.schedule("mod.add", [i], in_=0, id=f"t{i}")
        reply = await scripts.claim(limit=10, lease_ms=60_000, horizon_ms=8, listener_id="me")
        items = reply[3:]
        runs = [Run.parse(*items[i:i + 3]) for i in range(0, len(items), 3)]
        for n, run in enumerate(runs):
            writer.add(Ending.of(run, EndingKind.OK),
                       RunFacts(run.escaped_id, "mod.add", 60_000 * 5 + n, 3, 1, 2))
            await writer.flush()  # the first sends what is owed (none), then every second
            clock.advance(0.4)
        assert writer.extras_owed
        await writer.flush_remaining(clock)
        assert not writer.extras_owed
        await client.aclose()
        return calls

    calls = asyncio.run(scenario())
    one = MinuteSlot(5, 1, 0, {bucket_of(2): 1}, {bucket_of(3): 1}).encode()
    three = MinuteSlot(5, 3, 0, {bucket_of(2): 3}, {bucket_of(3): 3}).encode()
    assert calls == [(1, [("mod.add", one)], True), (1, [], False), (1, [], False),
                     (1, [("mod.add", three)], True), (1, [], False),
                     (0, [("mod.add", one)], True)]
    assert producer.stats().fired == 5
    assert len(producer.history()) == 5


def test_a_failure_record_is_written_as_json_and_read_back_typed() -> None:
    dead = execute("mod.boom", ["bang"])
    token, kind, failure_id, data = dead.wire()
    assert (token, kind, failure_id) == ("7", "fail", "t:7")
    assert json.loads(data)["message"] == "bang"
    assert FailureRecord.from_dict(json.loads(data)) == dead.failure


def test_runs_handed_back_at_a_stop_keep_their_place_in_their_keys_order() -> None:
    """A stopping listener hands back a run handed over holding its key's slot and the run
    next in line after it, neither started: the second says which run it follows
    (``finish.lua`` puts it back into its key's queue, in its place, not behind the key's
    later timers in the due index), and once the first is handed back (its slot kept for
    its timer, the second taken back with it) the second writes nothing."""
    record = Record("mod.add", [1, 2], {Option.KEY: "k"}).encode()
    calls = len(mod.CALLS)

    async def scenario() -> tuple[Executed, Executed, Executed]:
        runner, stopping, turns = Runner(2), asyncio.Event(), Turns()
        stopping.set()
        try:
            executor = executor_of(runner, turns=turns, stopping=stopping)
            due = round(REDIS_NOW_MS)
            holder = Run("7", "a", record, due, 0, "handoff")
            following = Run("8", "b", record, due, 0, "next", follows="7")
            alone = Run("9", "c", record, due, 0, "next", follows="5")
            for run in (holder, following, alone):
                turns.start(run)
            done = await executor.execute(alone), await executor.execute(holder)
            return (*done, await executor.execute(following))
        finally:
            runner.shutdown()

    alone, holder, following = asyncio.run(scenario())
    assert alone.ending is not None and alone.ending.wire() == ("9", "release", "", "5")
    assert holder.ending is not None and holder.ending.wire() == ("7", "release", "", "")
    assert following.ending is None and following.report is None
    assert len(mod.CALLS) == calls


class LetsFirstGo:
    """A flow gate that lets every run go, run "1" as a rate's run with a start window
    ending ``window`` s from its gate call (past already when negative)."""

    def __init__(self, window: float) -> None:
        self.window = window

    async def admit(self, run: Run, record: Record, policy: Any) -> Admission:
        return Admission(None, time.monotonic() + self.window) if run.token == "1" else FREE


@pytest.mark.parametrize("window", [-1.0, 60.0])
def test_a_rate_run_past_its_start_window_is_handed_back_with_its_run_next_in_line(
        window: float) -> None:
    """A rate's run that reaches its call past the window its gate gave it (the listener
    was busy) does not start: its rate's next run, gated an interval after it on another
    listener, may be starting now. It is handed back uncounted (T17), and the run next in
    line after it on its key, which would have started in its thread as it returned, does
    not start either: the hand-back takes it back into the key's queue. Within its window,
    both start."""
    calls = len(mod.CALLS)
    done, after = run_with_next_in_line(LetsFirstGo(window))
    if window < 0:
        assert done.report is None and done.ending is not None
        assert (done.ending.token, done.ending.kind) == ("1", EndingKind.RELEASE)
        assert after.ending is None and after.report is None  # taken back with it
        assert len(mod.CALLS) == calls, "neither run called its task"
    else:
        assert done.ending is not None and done.ending.kind == EndingKind.OK
        assert after.ending is not None and after.ending.kind == EndingKind.OK
        assert len(mod.CALLS) == calls + 2


class LateFirst:
    """A flow gate whose rate lets run "1" go twice: the first time with its start window
    past already (the listener was busy), the second with it open (``late`` times)."""

    def __init__(self, late: int) -> None:
        self.late, self.asked = late, 0

    async def admit(self, run: Run, record: Record, policy: Any) -> Admission:
        if run.token != "1":
            return FREE
        self.asked += 1
        return Admission(None, time.monotonic() + (-1.0 if self.asked <= self.late else 60.0))


@pytest.mark.parametrize("late", [1, 2])
def test_a_rate_run_past_its_start_window_asks_its_gate_once_more(late: int) -> None:
    """A rate's run that reached its call past its window asks its gate again at once
    (T29: its unused slot moves to now while nobody took the next) and starts within the
    new window, its run next in line after it. Past its window on that second try too, it
    is handed back (T17), its run next in line with it."""
    calls = len(mod.CALLS)
    gate = LateFirst(late)
    done, after = run_with_next_in_line(gate)
    assert gate.asked == 2
    if late == 1:
        assert done.ending is not None and done.ending.kind is EndingKind.OK
        assert after.ending is not None and after.ending.kind is EndingKind.OK
        assert len(mod.CALLS) == calls + 2
    else:
        assert done.ending is not None and done.ending.kind is EndingKind.RELEASE
        assert after.ending is None and len(mod.CALLS) == calls


class LateChild:
    """Quarantine whose first ``late`` children read their word past its start window."""

    def __init__(self, late: int) -> None:
        self.late, self.children = late, 0

    async def run(self, timer_id: str, token: str, *args: Any) -> Outcome:
        self.children += 1
        return LATE if self.children <= self.late else Outcome("ok", "", "")


@pytest.mark.parametrize("late", [1, 2])
def test_a_rerun_whose_child_came_past_its_start_window_asks_again_in_a_new_child(
        late: int) -> None:
    """A rate's rerun whose quarantine child read the word to start past its window
    started nothing: a new child asks the gate again (T29) and runs it; past the window
    again, the run is handed back (T17)."""
    record = Record("mod.add", [1, 2], {Option.KEY: "k"}).encode()
    quarantine = LateChild(late)
    done = execute_fenced(Run("1", "7", record, round(REDIS_NOW_MS), 1, "recovered"),
                          quarantine, Revalidated(True))
    assert quarantine.children == 2
    assert done.ending is not None
    assert done.ending.kind is (EndingKind.OK if late == 1 else EndingKind.RELEASE)


def _busy_until(moment: float) -> None:
    """A task that holds its thread until ``moment`` (``time.monotonic``)."""
    time.sleep(max(0.0, moment - time.monotonic()) + 0.001)


async def _noted(value: int) -> None:
    mod.CALLS.append(("noted", value))


@pytest.mark.parametrize("fn", [mod.add, _noted])
def test_a_run_that_waits_for_a_thread_past_its_start_window_is_not_called(
        fn: Callable[..., Any]) -> None:
    """The one thread is busy until the rate run's window has passed: the run is not
    called (a coroutine neither, once its turn comes past the window); a window still
    open when a thread takes it up lets it start."""
    calls = len(mod.CALLS)

    async def scenario(window: float) -> Outcome:
        runner = Runner(1)
        try:
            busy_until = time.monotonic() + 0.05
            start_by = busy_until + window
            busy = asyncio.ensure_future(runner.call(_busy_until, [busy_until]))
            await asyncio.sleep(0)  # its job is queued first: it takes the one thread
            if fn is _noted:
                await busy  # the coroutine's turn comes once the thread is free
            outcome = await runner.call(fn, [1], start_by=start_by)
            await busy
            return outcome
        finally:
            runner.shutdown()

    assert asyncio.run(scenario(0.0)).kind == "late"
    assert len(mod.CALLS) == calls
    assert asyncio.run(scenario(60.0)).ok
    assert len(mod.CALLS) == calls + 1
