"""The supervisor of ``timers listen --processes N``: restart budget, exit reasons, the
parent watch. Its children (giving up on one that keeps dying, passing a signal on) are
processes: ``tests/integration/test_supervisor.py``."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from types import SimpleNamespace

import pytest

import timers.listener.supervision.supervisor as supervisor_module
from timers.listener.supervision.orphans import SAME_STOP_WINDOW, watch_parent
from timers.listener.supervision.recycling import (
    CLAIMING,
    HANDOVER_SIGNAL,
    RECYCLE,
    STANDBY,
    STANDBY_ENV,
    TAKE_OVER_SIGNAL,
)
from timers.listener.supervision.supervisor import (
    ListenOptions,
    RestartBudget,
    Supervisor,
    adopts_orphans,
    exit_reason,
)
from timers.model.clock import ManualClock

# -- RestartBudget ----------------------------------------------------------------------


def test_budget_allows_up_to_its_maximum_within_the_window_then_refuses() -> None:
    budget = RestartBudget(max_restarts=3, window=10.0)
    assert [budget.allow(t) for t in (100.0, 101.0, 102.0)] == [True, True, True]
    assert budget.allow(103.0) is False
    assert budget.allow(109.9) is False
    assert budget.allow(110.0) is False, "100.0 is still within 10 s of 110.0"


def test_budget_allows_again_once_old_restarts_leave_the_window() -> None:
    budget = RestartBudget(max_restarts=3, window=10.0)
    for t in (100.0, 101.0, 102.0):
        assert budget.allow(t)
    assert not budget.allow(105.0)
    assert budget.allow(110.5), "the restart at 100.0 left the window"
    assert not budget.allow(110.6), "101.0, 102.0 and 110.5 are within 10 s"
    assert budget.allow(112.1), "101.0 and 102.0 left the window"
    assert budget.allow(112.2)
    assert not budget.allow(112.3)


def test_refused_restarts_do_not_use_up_the_budget() -> None:
    budget = RestartBudget(max_restarts=1, window=5.0)
    assert budget.allow(0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        assert not budget.allow(t)
    assert budget.allow(5.5), "only the allowed restart at 0.0 counts"


def test_default_budget_is_ten_restarts_a_minute() -> None:
    budget = RestartBudget()
    assert all(budget.allow(float(t)) for t in range(10))
    assert not budget.allow(10.0)
    assert budget.allow(60.5)


# -- the listeners' supervisor ------------------------------------------------------------


def test_recycled_listeners_have_a_standby_child_and_burst_or_plain_ones_none() -> None:
    """With recycling a child started but not claiming takes over from a recycled one at
    once; a burst run ends when nothing is due, so it keeps none, nor does a supervisor
    that recycles nothing."""
    assert Supervisor.for_listeners(ListenOptions(max_runs_per_child=500), 2).use_standby
    assert Supervisor.for_listeners(ListenOptions(max_memory_per_child=256.0), 1).use_standby
    burst = ListenOptions(max_runs_per_child=500, burst=True)
    assert not Supervisor.for_listeners(burst, 2).use_standby
    assert not Supervisor.for_listeners(ListenOptions(), 2).use_standby


# -- exit_reason ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (3, "exited with code 3"),
        (255, "exited with code 255"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (-signal.SIGTERM, "killed by SIGTERM"),
        (-signal.SIGSEGV, "killed by SIGSEGV"),
        (-200, "killed by signal 200"),
    ],
)
def test_exit_reason_names_codes_and_signals(code: int, reason: str) -> None:
    assert exit_reason(code) == reason


def test_the_parent_watch_stops_a_child_whose_supervisor_is_gone() -> None:
    """The fallback to PR_SET_PDEATHSIG: a changed parent pid (re-parented) stops the child,
    and aborts the stop after the grace (nobody is left to stop it later)."""
    calls: list[str] = []
    parents = iter([42, 42, 1])
    asyncio.run(asyncio.wait_for(
        watch_parent(42, lambda: calls.append("stop"), lambda: calls.append("abort"),
                     getppid=lambda: next(parents), interval=0.001, grace=0.001), 5))
    assert calls == ["stop", "abort"]


# -- adopts_orphans ---------------------------------------------------------------------

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
@pytest.mark.skipif(os.getpid() == 1, reason="PID 1 adopts orphans whatever its flag")
def test_a_child_subreaper_adopts_orphans_and_a_plain_process_does_not() -> None:
    """Outside a pid namespace of its own the supervisor reaps orphans only as a child
    subreaper (``docs/deploy``): the flag is read back from the kernel. This process is
    made one, then a plain one (it starts no process meanwhile); its own flag is put back."""
    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(0)
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    try:
        assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        assert adopts_orphans() is True
        assert libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) == 0
        assert adopts_orphans() is False
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, flag.value, 0, 0, 0)


# -- the stop passed on -----------------------------------------------------------------


class DrainingChild:
    """A listener child as the supervisor sees it: it stops ``drain`` seconds (of ``clock``)
    after its first SIGTERM, its runs done; a later SIGTERM aborts it at once."""

    pid = 4242

    def __init__(self, clock: ManualClock, drain: float) -> None:
        self.clock, self.drain = clock, drain
        self.signals: list[tuple[float, int]] = []
        self.ends_at: float | None = None
        self.killed = False

    def poll(self) -> int | None:
        if self.ends_at is not None and self.clock.monotonic() >= self.ends_at:
            return 0
        return None

    def send_signal(self, signum: int) -> None:
        self.signals.append((self.clock.monotonic(), signum))
        self.ends_at = self.clock.monotonic() + (self.drain if len(self.signals) == 1 else 0)

    def kill(self) -> None:
        self.killed = True
        self.ends_at = self.clock.monotonic()

    def wait(self) -> int:
        return 0


def stopping(monkeypatch: pytest.MonkeyPatch, drain: float,
             more_signals_at: tuple[float, ...] = ()) -> tuple[DrainingChild, ManualClock]:
    """A supervisor told to stop (one signal, and one more at each of ``more_signals_at``
    seconds into the stop) with one child that drains for ``drain`` s; its wait's sleeps
    move the clock."""
    clock = ManualClock()
    child = DrainingChild(clock, drain)
    sup = Supervisor(["listener"], 1, shutdown_timeout=30.0, clock=clock)
    sup.children = {0: child}  # type: ignore[dict-item]
    sup.signals_received = 1
    start, later = clock.monotonic(), list(more_signals_at)

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        while later and clock.monotonic() - start >= later[0]:
            later.pop(0)
            sup.signals_received += 1

    monkeypatch.setattr(supervisor_module, "time", SimpleNamespace(sleep=sleep))
    sup._shutdown()
    return child, clock


def test_one_stop_signal_is_passed_on_once_while_the_children_drain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A service manager's one SIGTERM: each child is told once and finishes its runs,
    however long past the same-stop window that takes (a second SIGTERM would abort it)."""
    child, _ = stopping(monkeypatch, drain=8 * SAME_STOP_WINDOW)
    assert [signum for _, signum in child.signals] == [signal.SIGTERM]
    assert not child.killed and child.poll() == 0


def test_a_second_stop_signal_is_passed_on_past_the_same_stop_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A second signal to the supervisor escalates: passed on to the children still
    draining, once twice the same-stop window has passed since the first."""
    child, _ = stopping(monkeypatch, drain=8 * SAME_STOP_WINDOW, more_signals_at=(0.5,))
    (first, _), (second, _) = child.signals
    assert second - first >= 2 * SAME_STOP_WINDOW
    assert second - first < 2 * SAME_STOP_WINDOW + 1
    assert not child.killed


# -- recycling with a standby -------------------------------------------------------------


class QuietChild:
    """A child as the supervisor sees it, running until told otherwise."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return None

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)


def test_a_recycled_child_is_replaced_by_the_standby_once_it_said_it_is_ready() -> None:
    """The standby says it is ready (tasks loaded, connected); the next child to recycle
    hands its slot to it at once, and a new standby is started behind it. Nothing is
    started cold in the slot."""
    sup = Supervisor(["listener"], 1, standby=True)
    started: list[str] = []
    pids = iter(range(200, 300))

    def spawn(command: object, env: dict[str, str]) -> QuietChild:
        started.append("standby" if env.get(STANDBY_ENV) else "child")
        return QuietChild(next(pids))

    def spawn_cold(slot: int, *, quiet: bool = False) -> QuietChild:
        started.append(f"cold {slot}")
        return QuietChild(next(pids))

    sup.links.spawn = spawn  # type: ignore[assignment,method-assign]
    sup._spawn = spawn_cold  # type: ignore[assignment,method-assign]
    old, standby = QuietChild(100), QuietChild(101)
    sup.children = {0: old}  # type: ignore[dict-item]
    sup.standby = standby  # type: ignore[assignment]
    sup._on_message(standby, STANDBY)  # type: ignore[arg-type]
    assert sup.standby_ready
    sup._on_message(old, f"{RECYCLE} 500 runs")  # type: ignore[arg-type]
    assert sup.children[0] is standby and standby.signals == [TAKE_OVER_SIGNAL]
    assert started == ["standby"], "a new standby, and no child started cold"
    assert sup.standby is not None and sup.standby is not standby and not sup.standby_ready


def test_a_replacement_claiming_stops_only_the_child_it_replaced_and_only_once() -> None:
    """Two slots recycle at different times. When slot 0's replacement says it claims,
    slot 0's old child (and no other) is told to stop claiming, once: slot 1's old child
    keeps claiming until its own replacement claims, so the fleet never dips below N
    claiming processes."""
    sup = Supervisor(["listener"], 2)
    pids = iter(range(200, 300))

    def spawn(slot: int, *, quiet: bool = False) -> QuietChild:
        sup.children[slot] = child = QuietChild(next(pids))  # type: ignore[assignment]
        return child

    sup._spawn = spawn  # type: ignore[assignment,method-assign]
    old0, old1 = QuietChild(100), QuietChild(101)
    sup.children = {0: old0, 1: old1}  # type: ignore[dict-item]
    sup._on_message(old0, f"{RECYCLE} 500 runs")  # type: ignore[arg-type]
    sup._on_message(old1, f"{RECYCLE} 500 runs")  # type: ignore[arg-type]
    new0, new1 = sup.children[0], sup.children[1]
    sup._on_message(new0, CLAIMING)  # type: ignore[arg-type]
    assert old0.signals == [HANDOVER_SIGNAL]
    assert old1.signals == [], "slot 1's old child stops only when its replacement claims"
    sup._on_message(new0, CLAIMING)  # type: ignore[arg-type]
    assert old0.signals == [HANDOVER_SIGNAL], "told once"
    sup._on_message(new1, CLAIMING)  # type: ignore[arg-type]
    assert old1.signals == [HANDOVER_SIGNAL]
