"""Suspect runs run in quarantine: a run whose listener died holding it runs in a child
process, so a poison kills only that child (one more death seen: a crash of its own timer)
and the innocents cut short with it run once and succeed.

Integration tests because quarantine is a process (a fork server and its children); the
timers themselves live in fakeredis, so the server these tests run on does not matter.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from pathlib import Path

import fakeredis
import pytest
import redis

from tests.conftest import wait_until, wait_until_async
from tests.integration.helpers import TIMERS_COMMAND, Processes
from tests.processes import alive
from tests.unit.helpers import claim, make_listener
from tests.unit.sample_tasks import mod
from tests.unit.test_context import lines
from tests.unit.test_crashes import PAST, crash
from timers import Timers
from timers.model.keys import Keyspace
from timers.store.script_modes import register_all

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

HERE = f"{socket.gethostname()}:{os.getpid()}"


def recovered(task: str, args: list[object], reruns: int, **options: object) -> Timers:
    """A fake server holding one timer whose listener died ``reruns`` times, then run it
    with a listener in a burst; returns the producer to look at the result."""
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    ks, scripts = Keyspace(), register_all(fake)
    producer = Timers(fake)
    producer.schedule(task, args, at=PAST, id="suspect")
    for i in range(reruns):
        crash(fake, ks, scripts, f"web-{i}:{100 + i}:ab")

    async def scenario() -> None:
        listener = make_listener(server, **options)
        await asyncio.wait_for(listener.run(burst=True), 30)
        await listener.redis.aclose()

    asyncio.run(scenario())
    return producer


@pytest.mark.parametrize("reruns", [1, 2])
def test_a_poison_suspect_dies_in_quarantine_until_its_crash_limit(
        reruns: int, caplog: pytest.LogCaptureFixture) -> None:
    """The listener survives; the deaths seen in quarantine make 3 (the lapses before do
    not count: a lapse may be a stopped listener), and the record tells the lapses apart."""
    producer = recovered("crash.die", [1], reruns)
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.fired, stats.failed) == (0, 0, 0, 1)
    (failure,) = producer.failed()
    assert failure.timer_id == "suspect"
    lapses = {1: "once", 2: "2 times"}[reruns]
    assert failure.data["message"] == (
        f"its process died 3 times in quarantine (last: exit code 1 in a quarantine process "
        f"on {HERE}), after its lease lapsed {lapses} (its listener died or stalled)")
    warnings = [r.getMessage() for r in caplog.records
                if "quarantine process died" in r.getMessage()]
    assert len(warnings) == 3, "one warning per death in quarantine"
    assert all("suspect" in w and "crash.die" in w for w in warnings)


def test_a_segfault_in_quarantine_is_named() -> None:
    producer = recovered("crash.segfault", [], 2)
    (failure,) = producer.failed()
    assert failure.data["message"] == (
        f"its process died 3 times in quarantine (last: killed by SIGSEGV in a quarantine "
        f"process on {HERE}), after its lease lapsed 2 times (its listener died or stalled)")


@pytest.mark.parametrize("task", ["crash.note", "crash.async_note"])
def test_an_innocent_suspect_runs_once_in_quarantine_and_succeeds(
        task: str, tmp_path: Path) -> None:
    trace = tmp_path / "runs"
    producer = recovered(task, [str(trace)], 2)
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.fired, stats.failed) == (0, 0, 1, 0)
    (line,) = trace.read_text().splitlines()
    assert int(line.split()[1]) != os.getpid(), "run in a child process, not the listener"


def test_a_rated_rerun_in_quarantine_starts_an_interval_from_the_rates_other_starts(
        tmp_path: Path) -> None:
    """A rerun of a rated task runs in a quarantine child, which takes a while to load;
    the rate's other timers start meanwhile, one an interval (250 ms) after another. The
    rerun asks the rate's gate once its child has loaded, right before it starts, so it
    starts an interval from the others too. (When the listener asked before the child
    loaded, the rerun started up to a whole load later, next to another timer of the
    rate: 36 to 57 ms apart in 3 runs.)"""
    trace = tmp_path / "starts"
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    ks, scripts = Keyspace(), register_all(fake)
    producer = Timers(fake)
    producer.schedule("crash.rated_note", [str(trace), "rerun"], at=PAST, id="suspect")
    crash(fake, ks, scripts, "web-0:100:ab")
    for i in range(12):
        producer.schedule("crash.rated_note", [str(trace), f"t{i}"], at=PAST)

    async def scenario() -> None:
        listener = make_listener(server)
        running = asyncio.create_task(listener.run())
        await wait_until_async(lambda: producer.stats().fired == 13, within=30,
                               message="the 13 timers of the rate to run")
        listener.stop()
        await asyncio.wait_for(running, 10)
        await listener.redis.aclose()

    asyncio.run(scenario())
    starts = sorted((float(line.split()[2]), line.split()[0])
                    for line in trace.read_text().splitlines())
    assert len(starts) == 13 and producer.stats().fired == 13
    gaps = [(round((b - a) * 1000), name_a, name_b)
            for (a, name_a), (b, name_b) in itertools.pairwise(starts)]
    # a start may come late by a thread's or a child's wake-up (tens of ms on a busy
    # machine), which shortens the gap after it; a rerun gated before its child loaded
    # lands anywhere in the lattice of the others' starts: at most 125 ms from one
    assert min(gap for gap, _, _ in gaps) >= 150, gaps


def test_a_task_failing_in_quarantine_is_an_ordinary_failure() -> None:
    producer = recovered("crash.fail", ["no such user"], 1)
    (failure,) = producer.failed()
    assert failure.data["error_type"] == "LookupError"
    assert failure.data["message"] == "no such user"
    assert "raise LookupError(message)" in failure.data["traceback"]


def test_the_timeout_kills_a_quarantined_task() -> None:
    producer = recovered("crash.too_slow", [], 1)
    (failure,) = producer.failed()
    assert (failure.data["error_type"], failure.data["message"]) == (
        "TimeoutError", "task did not finish within 0.3 s")


def test_a_stopping_listener_ends_its_quarantine_process_and_hands_the_run_back(
        tmp_path: Path) -> None:
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    ks, scripts = Keyspace(), register_all(fake)
    producer = Timers(fake)
    trace = tmp_path / "runs"
    producer.schedule("crash.linger", [str(trace)], at=PAST, id="suspect")
    crash(fake, ks, scripts, "web-1:101:ab")

    async def scenario() -> None:
        listener = make_listener(server, shutdown_timeout=0.2)
        running = asyncio.create_task(listener.run())
        await wait_until_async(trace.exists, message="the quarantined task to start")
        listener.stop()
        await asyncio.wait_for(running, 10)
        await listener.redis.aclose()

    asyncio.run(scenario())
    pid = int(trace.read_text().split()[1])
    assert not alive(pid), "the quarantine process ended with the listener"
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.fired, stats.failed) == (1, 0, 0, 0)


def test_a_quarantined_task_sees_the_listeners_environment_as_it_is_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork server starts at the first quarantined run and keeps that moment's
    environment; a variable the app sets later must still reach a later quarantined task,
    as it reaches one run in-process."""
    recovered("crash.note", [str(tmp_path / "warm-up")], 1)  # the fork server is up now
    monkeypatch.setenv("TIMERS_QUARANTINE_PROBE", "set-later")
    seen = tmp_path / "env"
    recovered("crash.note_env", [str(seen), "TIMERS_QUARANTINE_PROBE"], 1)
    assert seen.read_text() == "set-later\n"


def test_a_poison_timer_below_its_crash_limit_reruns_in_quarantine_not_in_the_listener(
        ) -> None:
    mod.CALLS.clear()
    producer = recovered("mod.add", [1, 2], reruns=2)
    assert mod.CALLS == [], "a suspect run never runs in the listener process"
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.fired, stats.failed) == (0, 0, 1, 0)


def test_a_quarantined_rerun_sees_its_context_in_the_child(tmp_path: Path) -> None:
    out = tmp_path / "ctx.jsonl"
    producer = recovered("ctx.sync_note", [str(out)], reruns=1)
    (seen,) = lines(out)
    assert (seen["id"], seen["attempt"]) == ("suspect", 2), "a rerun after a crash counts"
    assert producer.stats().fired == 1


SLOW_IMPORT = """
import time
from pathlib import Path
log = Path(__file__).parent.parent / "imports"
with log.open("a") as out:
    out.write(f"start {time.time()}\\n")
time.sleep(0.3)  # an import that takes a while: the load being measured
with log.open("a") as out:
    out.write(f"end {time.time()}\\n")


def ok(n):
    return n
"""

def three_suspects_of_slowload(tmp_path: Path, client: redis.Redis) -> Timers:
    """A tasks package ``slowload`` in ``tmp_path`` whose import takes a while (it notes
    each import in ``tmp_path/imports``), and three timers of it whose listener died
    holding them (their leases lapsed): a producer on ``client``."""
    package = tmp_path / "slowload"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "work.py").write_text(SLOW_IMPORT)
    ks, scripts = Keyspace(), register_all(client)
    producer = Timers(client)
    for i in range(3):
        producer.schedule("work.ok", [i], at=PAST, id=f"suspect-{i}")
    claimed = claim(scripts, ks, listener="web-0:100:ab").claimed
    assert len(claimed) == 3
    for run in claimed:
        client.zadd(ks.running, {run.token: 0}, xx=True)  # its listener died: lease lapsed
    return producer


def test_suspects_load_in_quarantine_one_at_a_time(tmp_path: Path) -> None:
    """Three runs of a dead listener: their quarantine children import the tasks package
    one after another (on a small machine, all at once took every core from the listener,
    and its other timers ran late); all three then run and succeed."""
    server = fakeredis.FakeServer()
    producer = three_suspects_of_slowload(tmp_path, fakeredis.FakeRedis(server=server))

    async def scenario() -> None:
        listener = make_listener(server, tasks="slowload", search_path=str(tmp_path))
        await asyncio.wait_for(listener.run(burst=True), 30)
        await listener.redis.aclose()

    asyncio.run(scenario())
    assert producer.stats().fired == 3
    marks = [line.split() for line in (tmp_path / "imports").read_text().splitlines()]
    imports = [(float(a[1]), float(b[1])) for a, b in zip(marks[::2], marks[1::2], strict=True)]
    assert [a[0] for a in marks] == ["start", "end"] * (len(marks) // 2), marks
    # the listener's own import, then one per child, none overlapping another
    assert len(imports) == 4, imports
    for (_, end), (start, _) in itertools.pairwise(imports):
        assert start >= end, f"two imports overlapped: {imports}"


def test_quarantine_children_fork_with_the_tasks_package_imported(
        tmp_path: Path, redis_url: str, processes: Processes) -> None:
    """A real listener reruns three runs of a dead one, each in a quarantine child: the
    tasks package is imported twice in all (the listener, and the fork server the children
    fork from), not once more per child, which took a small machine's cores from the
    listener's other timers."""
    producer = three_suspects_of_slowload(tmp_path, redis.Redis.from_url(redis_url))
    env = {**processes.env(), "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), processes.env().get("PYTHONPATH", "")])}
    listener = processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "slowload",
                               env=env)
    wait_until(lambda: producer.stats().fired == 3, timeout=30,
               message=f"three reruns: {processes.output(listener)}")
    marks = (tmp_path / "imports").read_text().split()[::2]
    assert marks == ["start", "end", "start", "end"], (
        f"the listener's import and the fork server's, no child's: {marks}")
    assert producer.stats().failed == 0
