"""Recycling under the supervisor, with fake children (Python one-liners, no Redis): a
child at its limit gets its replacement before it exits, its exit 0 costs no restart, a
crash while recycling still does.

Integration tests because the children are processes; no Redis is involved, so these run on
one server only. The child's side: ``tests/unit/test_recycling.py``.
"""

from __future__ import annotations

import logging
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.processes import alive
from timers.listener.supervision.supervisor import RestartBudget, Supervisor

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

# Each fake child takes the next number (child-0, child-1, ...) and plays the role at that
# place in the comma-separated list (the last role for any later child). Roles:
#   recycler     asks to be replaced, waits for the go-ahead (SIGUSR1), drains, exits 0
#   crasher      the same, but dies with code 3 once told to stop claiming
#   stubborn     asks to be replaced and then just sleeps (a stop signal kills it); notes
#                "told" if the go-ahead comes all the same
#   replacement  says it claims, waits for the supervisor to reap child 0, then stops it
#   quiet        never says it claims; stops the supervisor after a window of 0.5 s in
#                which the old child must not be told to drain
#   patient      a recycler that asks only once the standby is ready
#   sleeper      just sleeps (a stop signal kills it)
# A standby child (``$TIMERS_STANDBY``) says it is ready, waits for SIGUSR2, claims, waits
# for the supervisor to reap child 0, then stops it; a later standby just sleeps. With the
# role dying-standby in the list, every standby exits 3 at once (the slot's child and the
# standby start together: a slot child that drew that role's number just sleeps).
# A child that "just sleeps" (time.sleep(60)) plays a live child until it is signalled: the
# sleep is the role, not a wait for something. Waits for an outcome poll it (wait_for).
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

    def note(what):
        with open(here / "log", "a") as log:
            log.write(f"{n} {what}\\n")

    def go_ahead(*_):
        told.append(True)
        if role == "stubborn":
            note("told")

    signal.signal(signal.SIGUSR1, go_ahead)

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
        note("standby ready")  # before the word: the supervisor's answer follows it
        say("standby")
        wait_for(lambda: go)
        note("takes over")
        say("claiming")
        old = (here / "asker").read_text()
        wait_for(lambda: not os.path.exists(f"/proc/{old}"))
        stop_supervisor()
    if role == "sleeper":
        time.sleep(60)
    if role == "patient":
        # the supervisor took the standby's word (its own log says so): a pipe read order
        # between two children is not the order they wrote in
        wait_for(lambda: (here / "supervisor-saw-standby").exists())
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
        time.sleep(0.3)  # the runs it still finishes (its drain takes that long)
        note("exits")
        sys.exit(0)
    if role == "replacement":
        time.sleep(0.2)  # its start-up takes that long: the old child claims meanwhile
        note("claims")
        say("claiming")
        old = (here / "pid-0").read_text()
        wait_for(lambda: not os.path.exists(f"/proc/{old}"))  # the supervisor reaped it
        stop_supervisor()
    if role == "quiet":
        time.sleep(0.5)  # the window in which the old child must not be told
        stop_supervisor()
    time.sleep(60)  # a role of no slot child (dying-standby): alive until it is stopped
""")


def fake_supervisor(tmp_path: Path, roles: str, max_restarts: int = 0,
                    standby: bool = False) -> Supervisor:
    """One slot of fake children; with the default budget any counted crash gives up."""
    command = [sys.executable, "-c", FAKE_CHILD, str(tmp_path), roles]
    return Supervisor(command, 1, shutdown_timeout=5, standby=standby,
                      budget=RestartBudget(max_restarts=max_restarts, window=3600))


def mark_ready_standby(tmp_path: Path, record: logging.LogRecord) -> bool:
    """Touch ``supervisor-saw-standby`` once the supervisor logs a ready standby."""
    if record.getMessage().endswith("is ready"):
        (tmp_path / "supervisor-saw-standby").touch()
    return True


def events(tmp_path: Path) -> list[str]:
    return (tmp_path / "log").read_text().splitlines()


def test_a_recycled_child_is_replaced_before_it_exits_and_costs_no_restart(
        tmp_path: Path, own_signal_handlers: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="timers.listener.supervision.supervisor")
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
    caplog.set_level("DEBUG", logger="timers.listener.supervision.supervisor")
    caplog.handler.addFilter(lambda record: mark_ready_standby(tmp_path, record))
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
