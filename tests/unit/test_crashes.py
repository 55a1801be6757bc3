"""Poison timers: a timer is dead of crashes only on deaths seen (a quarantine child that
exits without an outcome), never of lapsed leases: a listener stopped past its lease lives.
A lapse is counted (``reruns``) and makes the run a suspect, run in quarantine."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest

from tests.unit.helpers import claim, make_listener
from tests.unit.sample_tasks import mod
from timers import Timers, task
from timers.listener.flow.gate import FREE, Admission
from timers.listener.leases import HeldRuns
from timers.listener.quarantine.crashes import died_outcome, listener_name
from timers.listener.quarantine.parent import Quarantine, how_it_died
from timers.model.keys import Keyspace
from timers.model.policy import TaskPolicy, policy_of
from timers.model.runs import Outcome, Run
from timers.store.script_modes import register_all

PAST = datetime(2001, 1, 1, tzinfo=UTC)


def crash(fake: fakeredis.FakeRedis, ks: Keyspace, scripts: dict[str, Any], by: str) -> str:
    """Claim the due timer as listener ``by`` and let it die: its lease lapses."""
    (claimed,) = claim(scripts, ks, listener=by).claimed
    fake.zadd(ks.running, {claimed.token: 0}, xx=True)
    return claimed.died_on


def test_the_claim_counts_crashes_and_names_the_listener_that_died(
        producer: Timers, scripts: dict[str, Any], ks: Keyspace,
        fake: fakeredis.FakeRedis) -> None:
    producer.schedule("a.b", [1], at=PAST, id="t")
    assert crash(fake, ks, scripts, "host-a:11:aa") == ""
    assert crash(fake, ks, scripts, "host-b:22:bb") == "host-a:11:aa"
    (third,) = claim(scripts, ks, listener="host-c:33:cc").claimed
    assert (third.source, third.reruns, third.died_on) == ("r", 2, "host-b:22:bb")
    run = Run.parse(third.token, third.run, "r@" + third.died_on)
    assert (run.reruns, run.died_on, run.source) == (2, "host-b:22:bb", "recovered")


def test_listener_name_is_host_and_pid() -> None:
    assert listener_name("web-1:4242:ab12cd") == "web-1:4242"


def test_a_dead_timers_message_counts_each_kind_of_crash_for_what_it_was() -> None:
    assert died_outcome(3, "exit code 1 on h:1").message == (
        "its process died 3 times in quarantine (last: exit code 1 on h:1)")
    assert died_outcome(1, "exit code 1 on h:1", lapses=1, before_start=1).message == (
        "its process died once in quarantine (last: exit code 1 on h:1), 1 quarantine "
        "process(es) died before starting it, after its lease lapsed once (its listener "
        "died or stalled)")


def test_max_crashes_is_a_task_option() -> None:
    @task(max_crashes=1)
    def fragile() -> None: ...

    assert policy_of(fragile).max_crashes == 1
    assert TaskPolicy().max_crashes == 3
    with pytest.raises(ValueError, match="max_crashes"):
        TaskPolicy(max_crashes=0)


def test_lapsed_leases_alone_never_make_a_timer_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timer whose lease lapsed 5 times (its listeners stopped past their lease, or
    died: a lapse cannot tell) is past a crash limit of 3 in lapses, yet nothing was seen
    to die: it runs, in quarantine (here a stand-in: unit tests start no processes), and
    completes. Before, it was recorded dead at the claim ("its listener went away 5
    times while holding it"): pauses counted as deaths."""
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    ks, scripts = Keyspace(), register_all(fake)
    producer = Timers(fake)
    producer.schedule("mod.add", [1, 2], at=PAST, id="paused")
    for i in range(5):
        crash(fake, ks, scripts, f"web-{i}:{100 + i}:ab")
    quarantined: list[tuple[str, int]] = []

    async def in_quarantine(self: Quarantine, timer_id: str, token: str, task: str,
                            *args: Any) -> Outcome:
        quarantined.append((timer_id, args[3]))  # fn, args, policy, reruns, admit
        return Outcome("ok", "", "")

    monkeypatch.setattr(Quarantine, "run", in_quarantine)

    async def scenario() -> None:
        listener = make_listener(server)
        await asyncio.wait_for(listener.run(burst=True), 15)
        await listener.redis.aclose()

    mod.CALLS.clear()
    asyncio.run(scenario())
    assert mod.CALLS == [], "a suspect run never runs in the listener process"
    assert quarantined == [("paused", 5)]
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.fired, stats.failed) == (0, 0, 1, 0)
    assert stats.counters.get("reruns") == 5, "lapses stay counted"


class Dying(Quarantine):
    """Quarantine whose children each die (exit code 1) after they said they started,
    or end with ``outcomes`` first; no process (unit tests start none)."""

    def __init__(self, *outcomes: Outcome) -> None:
        super().__init__(None, "h:1", HeldRuns())  # type: ignore[arg-type]
        self.outcomes = list(outcomes)
        self.children = 0

    def _target(self, task: str, fn: Any) -> tuple[str, str | None, str, bytes]:
        return ("", None, task, b"")

    async def _once(self, target: Any, args: Any, limit: float | None,
                    cell: Any = None, admit: Any = None, aside: Any = None,
                    died: int = 0) -> tuple[Outcome | None, int | None, bool]:
        self.children += 1
        if self.outcomes:
            return self.outcomes.pop(0), 0, True
        return None, 1, True


@pytest.mark.parametrize("reruns", [1, 5])
def test_only_deaths_seen_in_quarantine_count_toward_max_crashes(reruns: int) -> None:
    """However many leases lapsed before, a poison in quarantine dies ``max_crashes``
    times there, each seen, before it is dead; a child that found its lease stale
    started nothing and died of nothing: handed back to the executor, uncounted."""
    quarantine = Dying()
    outcome = asyncio.run(quarantine.run("t", "9", "a.b", lambda: None, [],
                                         TaskPolicy(max_crashes=3), reruns))
    assert quarantine.children == 3
    assert outcome.kind == "crashed" and outcome.message.startswith(
        "its process died 3 times in quarantine (last: exit code 1 in a quarantine process "
        "on h:1), after its lease lapsed")
    stale = Dying(Outcome("stale", "", "not held"))
    assert asyncio.run(stale.run("t", "9", "a.b", lambda: None, [], TaskPolicy(max_crashes=1),
                                 reruns)).kind == "stale"
    assert stale.children == 1


class DyingOnceGated(Dying):
    """Each child loads, waits for the flow gate's word (asked here as the real one asks
    it), starts the task and dies, but the last, whose task returns."""

    def __init__(self, deaths: int) -> None:
        super().__init__()
        self.deaths = deaths

    async def _once(self, target: Any, args: Any, limit: float | None,
                    cell: Any = None, admit: Any = None, aside: Any = None,
                    died: int = 0) -> tuple[Outcome | None, int | None, bool]:
        self.children += 1
        assert admit is not None
        if (await admit()).held is not None:
            return Outcome("held", "wait", "held back"), 0, False
        if self.children <= self.deaths:
            return None, 1, True
        return Outcome("ok"), 0, True


def test_a_rerun_whose_child_died_is_gated_once_for_all_its_children() -> None:
    """A rate's (or a key's) rerun in quarantine asks its gate when its first child has
    loaded; a child started again after a death starts on the slot the first took: asking
    again would take a second slot of the rate (and, held back, lose the deaths so far)."""
    asked: list[int] = []

    async def gate() -> Admission:
        asked.append(1)
        return FREE

    quarantine = DyingOnceGated(deaths=2)
    outcome = asyncio.run(quarantine.run("t", "9", "a.b", lambda: None, [],
                                         TaskPolicy(max_crashes=3), 1, admit=gate))
    assert outcome.ok and quarantine.children == 3
    assert len(asked) == 1, "the gate is asked once"


def test_how_a_process_died_reads_well() -> None:
    assert how_it_died(-11) == "killed by SIGSEGV"
    assert how_it_died(1) == "exit code 1"
