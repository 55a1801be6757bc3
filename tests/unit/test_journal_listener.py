"""A listener and the endings journals of others (:mod:`timers.listener.endings.journal`), on
fakeredis: a run whose ending another listener journaled is ended as journaled, never run
again, whether that listener died (its journal is adopted) or its lease lapsed while it
lived on (its journal is read when the run is recovered)."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest

from tests.conftest import wait_until_async
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.sample_tasks import mod
from timers import Listener, Timers
from timers.listener.endings.journal import DIR_ENV, Journal, journal_directory, server_identity
from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.store.script_rows import GateRun, NewTimer, Taker
from timers.store.scripts import Scripts

KS = Keyspace()
OTHER = "host-b:7:0a0a0a"
"""The listener that claimed the run and ran it to its end, then went away or stalled."""


@pytest.fixture(autouse=True)
def journals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    yield


def completed_elsewhere(server: fakeredis.FakeServer, directory: Path) -> Journal:
    """A timer claimed by OTHER, whose task returned there (journaled) before its ending
    reached Redis; then its lease lapsed."""
    client = fakeredis.FakeRedis(server=server)
    Timers(client).schedule("mod.add", [1, 2], in_=0, id="once")
    reply = Scripts(client, KS).claim(limit=1, lease_ms=60_000, horizon_ms=0,
                                      listener_id=OTHER, groups=("default",))
    run = Run.parse(*reply[3:6])
    journal = Journal(directory, OTHER)
    note = journal.note(0, run)
    assert note is not None
    journal.append(*note)
    client.zadd(KS.running, {run.token: 0})  # its lease lapsed
    return journal


def burst(server: fakeredis.FakeServer, before: Callable[[Path], object]) -> Path:
    """A listener until nothing is due; ``before`` is given its journals' directory."""
    async def scenario() -> Path:
        listener = Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                            search_path=str(ROOT))
        directory = journal_directory(await server_identity(
            listener.redis, listener.keys.instance, listener.prefix))
        before(directory)
        await asyncio.wait_for(listener.run(burst=True), 15)
        await listener.redis.aclose()
        return directory

    return asyncio.run(scenario())


def stats(server: fakeredis.FakeServer) -> dict[str, int]:
    return Timers(fakeredis.FakeRedis(server=server)).stats().counters


def test_a_run_a_dead_listener_ended_is_written_from_its_journal(
        server: fakeredis.FakeServer) -> None:
    def dead(directory: Path) -> None:
        completed_elsewhere(server, directory).close()  # gone: its lock with it, its file left

    directory = burst(server, dead)
    assert mod.CALLS == [], "not run again"
    assert stats(server).get("fired") == 1
    assert [name.endswith(".adopted") for name in os.listdir(directory)] == [True]


def test_a_recovered_run_that_had_ended_is_ended_as_journaled_not_run_again(
        server: fakeredis.FakeServer) -> None:
    journals: list[Journal] = []

    def stalled(directory: Path) -> None:
        # OTHER lives on (its journal locked) but stalled past its lease: its run is
        # recovered by the next claim
        journals.append(completed_elsewhere(server, directory))

    burst(server, stalled)
    fd = os.open(journals[0].path, os.O_RDONLY)
    with pytest.raises(BlockingIOError):  # it was never adopted: its owner lives
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    assert mod.CALLS == [], "not run again"
    counters = stats(server)
    assert (counters.get("fired"), counters.get("reruns")) == (1, 1)
    journals[0].close()


def test_listeners_that_reach_one_server_by_two_addresses_share_their_journals() -> None:
    """One server reached by two addresses (a proxy, a name and an IP) is one directory of
    journals: a listener there adopts the other's; two servers are two directories."""
    one, other = fakeredis.FakeServer(), fakeredis.FakeServer()

    async def identities() -> list[str]:
        clients = [fakeredis.FakeAsyncRedis(server=one, host="127.0.0.1", port=6379),
                   fakeredis.FakeAsyncRedis(server=one, host="proxy.local", port=7000),
                   fakeredis.FakeAsyncRedis(server=other, host="127.0.0.1", port=6379)]
        found = [await server_identity(client, KS.instance, KS.prefix) for client in clients]
        for client in clients:
            await client.aclose()
        return found

    by_name, by_proxy, elsewhere = asyncio.run(identities())
    assert by_name == by_proxy != elsewhere
    assert journal_directory(by_name) == journal_directory(by_proxy)


def test_a_run_whose_function_returned_unseen_by_its_stopping_listener_runs_once(
        server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener stops (an error stopped it, or its shutdown timeout passed) while a run's
    function has returned in its thread but the event loop has not taken the result yet
    (results are gathered while the process is busy). Handed back as unfinished, the run
    ran again; the journal has its ending: the next listener of the host writes it."""
    from timers.listener.calling.thread_pool import ThreadPool

    Timers(fakeredis.FakeRedis(server=server)).schedule("mod.add", [1, 2], in_=0, id="once")

    async def stops_unseen() -> None:
        listener = Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                            search_path=str(ROOT), shutdown_timeout=0.1)
        running = asyncio.create_task(listener.run())
        await wait_until_async(lambda: mod.CALLS, message="the task to return")
        listener.stop()
        await asyncio.wait_for(running, 10)
        await listener.redis.aclose()

    with monkeypatch.context() as unseen:  # the loop never takes a thread's result
        unseen.setattr(ThreadPool, "_deliver", lambda self, timed=False: None)
        asyncio.run(stops_unseen())
    assert Timers(fakeredis.FakeRedis(server=server)).stats().pending == 0, "not handed back"
    burst(server, lambda directory: None)  # the next listener: adopts the journal
    assert mod.CALLS == [("add", (1, 2))], "ran once"
    assert stats(server).get("fired") == 1


def test_a_listener_stopped_while_redis_is_out_of_reach_at_its_start_stops(
        server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis goes away between the listener's checks and its journal's id: the listener
    waits for it, and a stop (SIGTERM, a supervisor's death) still ends it. (A listener
    child outlived its dead supervisor this way, deaf to SIGTERM.)"""
    import redis.exceptions

    from timers.listener import lifecycle

    asked: list[int] = []

    async def unreachable(*args: object) -> str:
        asked.append(1)
        raise redis.exceptions.ConnectionError("Connection refused")

    monkeypatch.setattr(lifecycle, "server_identity", unreachable)

    async def scenario() -> None:
        listener = Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                            search_path=str(ROOT))
        running = asyncio.create_task(listener.run())
        await wait_until_async(lambda: asked, message="the journal's id to be asked")
        listener.stop()
        await asyncio.wait_for(running, 5)
        await listener.redis.aclose()

    asyncio.run(scenario())


def test_a_run_next_in_line_taken_back_after_it_ended_is_not_run_again(
        server: fakeredis.FakeServer) -> None:
    """T5 takes a recovered run's run next in line back into its key's queue as a rerun
    (its listener may have started it in the run before it's thread). When that listener
    had run it to its end, its journal says so: the rerun, claimed from the key's queue
    with no word of who ran it before, is ended as journaled, not run again (the chaos
    checker: completed twice, a Redis restart then a pause of the listener that ran it)."""
    client = fakeredis.FakeRedis(server=server)
    scripts = Scripts(client, KS)
    for i, name in enumerate(("x", "a", "b")):  # x holds key k; a, b wait for it
        scripts.schedule([NewTimer(name, "mod.add;k=k:[1,2]", "in", -30 + i, "r")])
    reply = scripts.claim(limit=3, lease_ms=60_000, horizon_ms=0, listener_id=OTHER,
                          groups=("default",))
    runs = [Run.parse(*reply[3 + i:6 + i]) for i in range(0, len(reply) - 3, 3)]
    assert [x.decode() for x in scripts.gate(60_000, [
        GateRun(r.token, key="k", limit=1) for r in runs])] == ["go", "wait", "wait"]
    handed = scripts.finish(retention_ms=1000, endings=[(runs[0].token, "ok", "", "")],
                            taker=Taker(OTHER, ("default",), 1, 60_000, True))
    a, b = (Run.parse(*handed[1 + i:4 + i]) for i in (0, 3))
    assert (a.timer_id, b.timer_id, b.follows) == ("a", "b", a.token)

    def stalled(directory: Path) -> None:
        # OTHER ran a and then b in its thread, journaled their ends, and stalled before
        # either ending reached Redis; both leases lapsed
        journal = Journal(directory, OTHER)
        for run in (a, b):
            note = journal.note(0, run)
            assert note is not None
            journal.append(*note)
        client.zadd(KS.running, {a.token: 0, b.token: 0})
        journals.append(journal)

    journals: list[Journal] = []
    burst(server, stalled)
    assert mod.CALLS == [], "neither ran again (a rerun would run in quarantine)"
    counters = stats(server)
    assert (counters.get("fired"), counters.get("failed", 0)) == (3, 0)
    journals[0].close()
