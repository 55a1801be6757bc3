"""Recycling under the supervisor, with fake children (Python one-liners, no Redis): a
child at its limit gets its replacement before it exits, its exit 0 costs no restart, a
crash while recycling still does; and the child's side: limits, messages on the pipe.

The listeners themselves are covered by ``tests/integration/test_recycling.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import textwrap
from pathlib import Path

import fakeredis
import pytest

from tests.processes import alive
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.sample_tasks import mod
from timers import Listener, Timers, TimerSpec
from timers.cli import app
from timers.cli.errors import run_app
from timers.exceptions import MemoryLimitTooLow
from timers.listener import RecycleLimits
from timers.listener.recycling import Recycler
from timers.listener.supervisor import ListenOptions, RestartBudget, Supervisor

# Each fake child takes the next number (child-0, child-1, ...) and plays the role at that
# place in the comma-separated list (the last role for any later child). Roles:
#   recycler     asks to be replaced, waits for the go-ahead (SIGUSR1), drains, exits 0
#   crasher      the same, but dies with code 3 once told to stop claiming
#   stubborn     asks to be replaced and then just sleeps (a stop signal kills it)
#   replacement  says it claims, waits for the supervisor to reap child 0, then stops it
#   quiet        never says it claims; stops the supervisor after a moment
#   patient      a recycler that asks only once the standby is ready
#   sleeper      just sleeps (a stop signal kills it)
# A standby child (``$TIMERS_STANDBY``) says it is ready, waits for SIGUSR2, claims, waits
# for the supervisor to reap child 0, then stops it; a later standby just sleeps. With the
# role dying-standby in the list, every standby exits 3 at once.
FAKE_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    here, roles = Path(sys.argv[1]), sys.argv[2].split(",")
    n = 0
    while True:
        try:
            os.close(os.open(here / f"child-{n}", os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            n += 1
    role = roles[min(n, len(roles) - 1)]
    (here / f"pid-{n}").write_text(str(os.getpid()))
    fd = int(os.environ["TIMERS_RECYCLE_FD"])
    told = []
    signal.signal(signal.SIGUSR1, lambda *_: told.append(True))

    def note(what):
        with open(here / "log", "a") as log:
            log.write(f"{n} {what}\\n")

    def say(message):
        os.write(fd, (message + "\\n").encode())

    def wait_for(condition):
        deadline = time.monotonic() + 10
        while not condition():
            if time.monotonic() > deadline:
                note("gave up waiting")
                sys.exit(9)
            time.sleep(0.02)

    def stop_supervisor():
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(60)

    if os.environ.get("TIMERS_STANDBY"):
        if "dying-standby" in roles:
            sys.exit(3)
        try:
            os.close(os.open(here / "first-standby", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            time.sleep(60)
        n = "S"
        go = []
        signal.signal(signal.SIGUSR2, lambda *_: go.append(True))
        say("standby")
        note("standby ready")
        wait_for(lambda: go)
        note("takes over")
        say("claiming")
        old = (here / "asker").read_text()
        wait_for(lambda: not os.path.exists(f"/proc/{old}"))
        stop_supervisor()
    if role == "sleeper":
        time.sleep(60)
    if role == "patient":
        wait_for(lambda: (here / "log").exists()
                 and "standby ready" in (here / "log").read_text())
        role = "recycler"
    if role in ("recycler", "crasher", "stubborn"):
        say("claiming")
        (here / "asker").write_text(str(os.getpid()))
        note("asks")
        say("recycle 3 runs")
        if role == "stubborn":
            time.sleep(60)
        wait_for(lambda: told)
        note("told")
        if role == "crasher":
            sys.exit(3)
        time.sleep(0.3)  # finishing its runs
        note("exits")
        sys.exit(0)
    if role == "replacement":
        time.sleep(0.2)  # starting up
        note("claims")
        say("claiming")
        old = (here / "pid-0").read_text()
        wait_for(lambda: not os.path.exists(f"/proc/{old}"))  # the supervisor reaped it
        stop_supervisor()
    time.sleep(0.5)
    stop_supervisor()
""")


def fake_supervisor(tmp_path: Path, roles: str, max_restarts: int = 0,
                    standby: bool = False) -> Supervisor:
    """One slot of fake children; with the default budget any counted crash gives up."""
    command = [sys.executable, "-c", FAKE_CHILD, str(tmp_path), roles]
    return Supervisor(command, 1, shutdown_timeout=5, standby=standby,
                      budget=RestartBudget(max_restarts=max_restarts, window=3600))


def events(tmp_path: Path) -> list[str]:
    return (tmp_path / "log").read_text().splitlines()


def test_a_recycled_child_is_replaced_before_it_exits_and_costs_no_restart(
        tmp_path: Path, own_signal_handlers: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="timers.listener.supervisor")
    supervisor = fake_supervisor(tmp_path, "recycler,replacement")
    assert supervisor.run() == 0, "a budget of 0 restarts was not touched"
    old_pid = (tmp_path / "pid-0").read_text()
    assert events(tmp_path) == ["0 asks", "1 claims", "0 told", "0 exits"], \
        "the old child claims until its replacement does, then drains and exits"
    assert list(supervisor.last_exits) == [], "exit 0 after recycling is no crash"
    assert supervisor.retiring == {}
    (replacement,) = supervisor.children.values()
    lines = [r.getMessage() for r in caplog.records]
    recycled = [line for line in lines if "recycling after 3 runs" in line]
    assert recycled == [f"listener 0 (pid {old_pid}) recycling after "
                        f"3 runs; replacement pid {replacement.pid} started"]
    assert f"listener 0 (pid {old_pid}) recycled: its runs finished" in lines
    assert not any(line.endswith("restarting") for line in lines), lines


def test_a_ready_standby_takes_over_at_once_and_a_new_one_starts(
        tmp_path: Path, own_signal_handlers: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="timers.listener.supervisor")
    supervisor = fake_supervisor(tmp_path, "patient", standby=True)
    assert supervisor.run() == 0
    # the slot's child and the standby start together: either may be child-0
    labels = {line.split()[0] for line in events(tmp_path)} - {"S"}
    (k,) = labels
    assert events(tmp_path) == ["S standby ready", f"{k} asks", "S takes over", f"{k} told",
                                f"{k} exits"]
    old = (tmp_path / "asker").read_text()
    first_standby = (tmp_path / f"pid-{1 - int(k)}").read_text()
    (current,) = supervisor.children.values()
    assert str(current.pid) == first_standby
    assert supervisor.standby is not None and str(supervisor.standby.pid) not in {
        old, first_standby}, "a new standby waits for the next recycle"
    assert list(supervisor.last_exits) == []
    lines = [r.getMessage() for r in caplog.records]
    assert (f"listener 0 (pid {old}) recycling after 3 runs; replacement pid "
            f"{first_standby} (the standby) takes over") in lines, lines


def test_a_standby_that_dies_is_a_crash_and_is_restarted(
        tmp_path: Path, own_signal_handlers: None) -> None:
    supervisor = fake_supervisor(tmp_path, "sleeper,dying-standby", max_restarts=2,
                                 standby=True)
    assert supervisor.run() == 1, "3 standby deaths spent a budget of 2 restarts"
    assert len(supervisor.last_exits) == 3
    assert all(e.endswith("exited with code 3") for e in supervisor.last_exits)


def test_a_child_that_crashes_while_recycling_counts_against_the_budget(
        tmp_path: Path, own_signal_handlers: None) -> None:
    supervisor = fake_supervisor(tmp_path, "crasher,replacement")
    assert supervisor.run() == 1, "the crash spent the budget of 0 restarts"
    (crash,) = supervisor.last_exits
    assert crash.endswith("exited with code 3"), crash
    (replacement,) = supervisor.children.values()
    assert replacement.returncode == -signal.SIGTERM, "giving up stopped the replacement"
    assert (tmp_path / "child-1").exists() and not (tmp_path / "child-2").exists(), \
        "the crashed child was not restarted: its replacement runs"


def test_a_crash_while_recycling_is_counted_but_not_restarted(
        tmp_path: Path, own_signal_handlers: None) -> None:
    supervisor = fake_supervisor(tmp_path, "crasher,replacement", max_restarts=5)
    assert supervisor.run() == 0
    assert len(supervisor.last_exits) == 1
    assert len(supervisor.budget._times) == 1, "one restart's worth of budget spent"
    assert not (tmp_path / "child-2").exists()


def test_a_stop_signal_stops_a_child_that_is_still_draining(
        tmp_path: Path, own_signal_handlers: None) -> None:
    supervisor = fake_supervisor(tmp_path, "stubborn,quiet")
    assert supervisor.run() == 0
    assert events(tmp_path) == ["0 asks"], "never told: its replacement never claimed"
    assert supervisor.retiring, "the old child was still recycling at the signal"
    (old,) = (r.child for r in supervisor.retiring.values())
    assert old.returncode == -signal.SIGTERM
    assert not alive(old.pid)


# -- the child's side ---------------------------------------------------------------------


def test_limits_name_what_was_reached() -> None:
    limits = RecycleLimits(max_runs=500, max_memory_mb=100)
    assert limits.reached(499, rss=lambda: 10_000_000) is None
    assert limits.reached(500, rss=lambda: 10_000_000) == "500 runs"
    assert limits.reached(3, rss=lambda: 120_000_000) == "120 MB of memory (limit 100 MB)"
    assert not RecycleLimits().enabled
    with pytest.raises(ValueError, match="--max-runs-per-child must be at least 1"):
        RecycleLimits(max_runs=0)


def test_a_child_asks_once_and_announces_that_it_claims_once() -> None:
    read_end, write_end = os.pipe()
    stopped: list[bool] = []
    try:
        recycler = Recycler(RecycleLimits(max_runs=2), lambda: stopped.append(True),
                            fd=write_end)
        recycler.published()
        recycler.published()
        for runs in (1, 2, 3, 4):
            recycler.after_run(runs)
        assert os.read(read_end, 4096).decode() == "claiming\nrecycle 2 runs\n"
        assert stopped == [], "it claims until the supervisor says its replacement does"
        assert recycler.heartbeat_info(stopping=False) == {"state": "claiming",
                                                           "recycling": "2 runs"}
    finally:
        os.close(read_end)
        os.close(write_end)


def test_without_a_supervisor_a_child_at_its_limit_stops_claiming_at_once() -> None:
    stopped: list[bool] = []
    recycler = Recycler(RecycleLimits(max_runs=1), lambda: stopped.append(True), fd=None)
    recycler.after_run(1)
    assert stopped == [True] and recycler.draining


def test_the_limits_reach_the_children_command_line() -> None:
    options = ListenOptions(max_runs_per_child=500, max_memory_per_child=256.0)
    command = options.child_command()
    assert command[command.index("--max-runs-per-child") + 1] == "500"
    assert command[command.index("--max-memory-per-child") + 1] == "256.0"
    assert options.recycles and not ListenOptions().recycles


def test_a_memory_limit_below_the_memory_at_start_is_refused_in_one_line() -> None:
    recycler = Recycler(RecycleLimits(max_memory_mb=1), lambda: None, fd=None)

    async def start() -> None:
        recycler.start(asyncio.get_running_loop())

    with pytest.raises(MemoryLimitTooLow, match=r"^--max-memory-per-child 1 MB is below this "
                                                r"listener's memory at start \(\d+ MB"):
        asyncio.run(start())


def test_draining_waits_for_every_run_unless_a_stop_signal_comes() -> None:
    async def scenario() -> tuple[bool, bool, list[str]]:
        published: list[str] = []
        recycler = Recycler(RecycleLimits(max_runs=1), lambda: None, fd=None)
        recycler.after_run(1)  # no supervisor: drains at once

        async def publish() -> None:
            published.append(recycler.state(stopping=True))

        quick = asyncio.create_task(asyncio.sleep(0.05))
        endless = asyncio.create_task(asyncio.sleep(3600))
        waiting = asyncio.create_task(recycler.wait_for_runs([quick, endless], publish))
        await asyncio.sleep(0.2)
        still_waiting = not waiting.done()  # no shutdown timeout: the endless run goes on
        recycler.hurry.set()  # SIGTERM: the ordinary shutdown takes over
        await asyncio.wait_for(waiting, 5)
        endless.cancel()
        return still_waiting, quick.done(), published

    still_waiting, quick_done, published = asyncio.run(scenario())
    assert still_waiting and quick_done
    assert published == ["draining"], "the heartbeat says it drains"


def test_the_command_refuses_a_memory_limit_below_a_listeners_size_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before starting any child (each would refuse, and be restarted until the budget
    ran out); and a run limit of 0 is a usage error."""
    code = run_app(app, ["listen", "--max-memory-per-child", "5", "--tasks", "tests.task_pkg"])
    err = capsys.readouterr().err
    assert code == 1
    assert re.fullmatch(r"error: --max-memory-per-child 5 MB is below this listener's memory "
                        r"at start \(\d+ MB, tasks loaded\): raise it\n", err), err
    assert run_app(app, ["listen", "--max-runs-per-child", "0"]) == 2
    assert "--max-runs-per-child" in capsys.readouterr().err


def test_a_listener_without_a_supervisor_stops_at_its_limit_and_hands_nothing_back() -> None:
    """The library's listener (fakeredis): at its limit it stops claiming, finishes what it
    runs and returns from run() by itself."""
    server = fakeredis.FakeServer()
    producer = Timers(fakeredis.FakeRedis(server=server))
    mod.CALLS.clear()
    producer.schedule_many(TimerSpec("mod.add", [i], in_=0) for i in range(10))

    async def scenario() -> Listener:
        listener = Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                            search_path=str(ROOT), concurrency=1,
                            recycle=RecycleLimits(max_runs=3))
        await asyncio.wait_for(listener.run(), 15)
        return listener

    listener = asyncio.run(scenario())
    assert listener.ended_count == 3 and len(mod.CALLS) == 3
    stats = producer.stats()
    assert (stats.pending, stats.running) == (7, 0), "the rest waits for the next listener"
    assert stats.counters.get("handed_back", 0) == 0
