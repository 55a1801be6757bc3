"""One fence, at the start, wherever the start happens (invariant 12), and dead-lettering
that counts deaths, not pauses (invariant 8): on a real server with real listener
processes, keyed commands under repeated pauses of a listener past its lease.

6 devices x 9 commands of 1 s (every third 3 s, longer than the lease), ``concurrency=1``
per device (half plain functions: a thread, or the thread of the run before them; half
``async def``: the event loop), three listeners with ``--lease 2``. A nemesis stops a
listener for 4 s (at most two at once): the one whose quarantine child just started a
long command (the child goes on while its listener is stopped), else the one that started
the newest run. Stopped runs lapse and run again elsewhere, in quarantine children, whose
own listener may be stopped next. Each run notes its fencing token and ``still_held()``
as it starts and as it ends, and when its fence let it start, with the system-wide
monotonic clock (tests/task_pkg/fenced.py): every start had its fence asked, no run of a
command starts with a token lower than one already started for it, ``still_held()`` is
False at the end of every run taken over before it ended, in whichever process it ran,
and no timer is dead: nothing died. A start whose fence passed just before its listener
was stopped, and whose first line came after it resumed, is dated from its fence (no
check can close that window: see :func:`dated`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, Processes, settled
from tests.integration.test_flow import listeners, wait_listening
from tests.task_pkg.fenced import PROBE_ENV
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

DEVICES, COMMANDS = 6, 9


def seconds(command: int) -> float:
    """How long a command runs: 1 s, and every third one 3 s (longer than the lease: a
    quarantine child of a stopped listener is still in it when another takes it over)."""
    return 3.0 if command % 3 == 2 else 1.0


def is_long(timer_id: str) -> bool:
    """Whether the command of ``timer_id`` (``d<device>-c<command>``) outlasts the lease."""
    return seconds(int(timer_id.rpartition("c")[2])) > 2


PAUSE = 4.0
"""Seconds a listener is stopped: twice its lease."""


def ledger_lines(ledger: Path) -> list[dict[str, Any]]:
    """The complete lines of the ledger: a line being written as it is read (its task's
    process stopped mid-write, or just not done) is left out."""
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines(keepends=True)
            if line.endswith("\n")]


def parent_of(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[1])


def listener_of(pid: int, listener_pids: set[int]) -> int | None:
    """The listener a process belongs to: itself, or the listener above a quarantine
    child (child -> fork server -> listener)."""
    for _ in range(3):
        if pid in listener_pids:
            return pid
        pid = parent_of(pid)
    return None


def fresh_child(lines: list[dict[str, Any]], listener_pids: set[int]) -> int | None:
    """The listener of a quarantine child that started a long command within the last
    0.3 s (stopped now, it stops renewing while its child goes on past the lease)."""
    ended = {(line["id"], line["token"]) for line in lines if line["ev"] == "end"}
    for line in reversed(lines):
        if (line["ev"] == "start" and line["pid"] not in listener_pids
                and is_long(line["id"]) and (line["id"], line["token"]) not in ended
                and time.monotonic() - line["t"] < 0.3):
            found = listener_of(line["pid"], listener_pids)
            if found is not None:
                return found
    return None


def newest_listener(lines: list[dict[str, Any]], listener_pids: set[int]) -> int | None:
    """The listener that started the newest run (itself, or through its child)."""
    for line in reversed(lines):
        found = listener_of(line["pid"], listener_pids)
        if found is not None:
            return found
    return None


Stop = tuple[int, float, float]
"""A stop of a listener by the nemesis: its pid, when it was stopped and resumed (monotonic)."""


def dated(line: dict[str, Any], stops: list[Stop]) -> float:
    """When a start happened: its line's time, or its fence check's if a stop of its
    process came between the two. A ``SIGSTOP`` between the check and the task's first
    line is the one window no check can close (the task then reads ``still_held()``
    False); a quarantine child is never stopped itself, so its starts are never moved."""
    fenced = line.get("fenced")
    if fenced is not None and any(pid == line["pid"] and fenced < stopped and resumed <= line["t"]
                                  for pid, stopped, resumed in stops):
        return float(fenced)
    return float(line["t"])


def judge(lines: list[dict[str, Any]], listener_pids: set[int],
          stops: list[Stop]) -> dict[str, Any]:
    """What the ledger shows, each start dated by :func:`dated` and each end by its line:
    starts no fence let through (unfenced), starts with an older token after a newer one
    of the same timer (stale starts), runs taken over (a newer token of their timer
    started) before they ended whose ``still_held()`` still said True at their end, and
    how many runs were taken over before they ended, by context."""
    newest: dict[str, int] = {}
    unfenced: list[dict[str, Any]] = []
    stale_starts: list[dict[str, Any]] = []
    taken_over: dict[tuple[str, int], bool] = {}  # (id, token) -> a newer token started
    held_stale: list[dict[str, Any]] = []
    taken: dict[str, int] = {"listener": 0, "quarantine": 0}
    when = {id(line): dated(line, stops) if line["ev"] == "start" else line["t"]
            for line in lines}
    for line in sorted(lines, key=lambda line: when[id(line)]):
        key = (line["id"], line["token"])
        context = "listener" if line["pid"] in listener_pids else "quarantine"
        if line["ev"] == "start":
            if line.get("fenced") is None:
                unfenced.append({**line, "context": context})
            if line["token"] <= newest.get(line["id"], 0):
                stale_starts.append({**line, "context": context})
            for (other_id, token) in taken_over:
                if other_id == line["id"] and token < line["token"]:
                    taken_over[(other_id, token)] = True
            newest[line["id"]] = max(newest.get(line["id"], 0), line["token"])
            taken_over[key] = False
        elif taken_over.get(key):
            taken[context] += 1
            if line["held"]:
                held_stale.append({**line, "context": context})
    return {"unfenced": unfenced, "stale_starts": stale_starts, "held_stale": held_stale,
            "taken_over": taken}


def test_keyed_commands_under_repeated_pauses_start_no_stale_run_and_none_dies(
        r: redis.Redis, redis_url: str, processes: Processes, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    procs = listeners(processes, redis_url, 3, "--tasks", TASKS, "--lease", "2",
                      env={**processes.env(), PROBE_ENV: "1"})
    wait_listening(r, 3, procs, processes)
    pids = {p.pid for p in procs}
    pauses = 0
    with Timers(redis_url) as t:
        t.schedule_many(
            TimerSpec("fenced.command" if d % 2 else "fenced.acommand",
                      [d, seconds(c), str(ledger)], in_=0.2, id=f"d{d}-c{c}")
            for d in range(DEVICES) for c in range(COMMANDS))
        deadline = time.monotonic() + 30
        stopped: dict[int, float] = {}  # pid -> when it is resumed (monotonic)
        stops: list[Stop] = []
        last_pause = last_look = 0.0
        try:
            while time.monotonic() < deadline:
                now = time.monotonic()
                for pid in [p for p, until in stopped.items() if until <= now]:
                    os.kill(pid, signal.SIGCONT)
                    stops.append((pid, stopped[pid] - PAUSE, time.monotonic()))
                    del stopped[pid]
                if now - last_look > 0.5:
                    last_look = now
                    if settled(t):
                        break
                lines = ledger_lines(ledger)
                target = fresh_child(lines, pids)  # at most two stopped: one runs on
                if target is None and not stopped and now - last_pause > 1.5:
                    target = newest_listener(lines, pids)
                if target is not None and target not in stopped and len(stopped) < 2:
                    os.kill(target, signal.SIGSTOP)
                    stopped[target] = now + PAUSE
                    last_pause = now
                    pauses += 1
                time.sleep(0.02)  # the nemesis's tick
        finally:
            for pid, until in stopped.items():
                os.kill(pid, signal.SIGCONT)
                stops.append((pid, until - PAUSE, time.monotonic()))
        wait_until(lambda: settled(t), 40, message="every command to end")
        stats = t.stats()
        failed = list(t.failed())
    lines = ledger_lines(ledger)
    seen = judge(lines, pids, stops)
    ended = {line["id"] for line in lines if line["ev"] == "end"}
    print(f"\n{pauses} pauses, {sum(1 for x in lines if x['ev'] == 'start')} starts "
          f"({sum(1 for x in lines if x['ev'] == 'start' and x['pid'] not in pids)} in "
          f"quarantine), "
          f"{seen['taken_over']} runs taken over before they ended, "
          f"{len(seen['stale_starts'])} stale starts, {len(seen['unfenced'])} unfenced, "
          f"{sum(1 for x in lines if dated(x, stops) != x['t'])} dated from their fence, "
          f"{len(seen['held_stale'])} taken-over runs still_held() True at their end, "
          f"{len(failed)} dead, reruns {stats.counters.get('reruns', 0)}")
    assert pauses >= 3
    assert seen["taken_over"]["quarantine"] >= 1, "no run in quarantine was taken over"
    assert seen["unfenced"] == [], "a run started without its fence asked"
    assert seen["stale_starts"] == [], "a run started with an older token than one started"
    assert seen["held_stale"] == [], "still_held() True in a run taken over"
    assert [(f.timer_id, f.data.get("message")) for f in failed] == [], "dead, nothing died"
    assert ended == {f"d{d}-c{c}" for d in range(DEVICES) for c in range(COMMANDS)}
    assert stats.fired == DEVICES * COMMANDS
