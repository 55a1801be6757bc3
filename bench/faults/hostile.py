"""The faults of a hostile world (issue 9): a full server, eviction, a task that kills its
process, a task that blocks the event loop, and the ``--processes`` supervisor killed.

==================  ========================================================================
oom                 ``noeviction`` at its memory limit: ``maxmemory`` set just above the
                    memory in use, filled with keys without a TTL and kept full for
                    ``OOM_HOLD_S`` while tasks longer than the lease run; then the filler is
                    deleted. Every timer must run once (renewals must get through)
evict-volatile      ``maxmemory-policy volatile-lru`` from the start; at the fault
                    ``maxmemory`` just above the memory in use and keys without a TTL
                    written until the expiring timer keys are evicted: the sweeper must
                    still fire every timer, once
poison              a task that ``os._exit(1)``s, listeners under ``--processes 2``: the
                    poison timer must be recorded dead after at most ``MAX_CRASHES`` runs
                    (not counted as lost); the runs it killed with it run again, no others
blocked-loop        ``async def`` tasks that ``time.sleep`` longer than the lease, blocking
                    their listener's event loop: every timer still runs once
supervisor-kill9    ``kill -9`` of the ``--processes 2`` supervisor (next to one plain
                    listener): its children must exit, their unfinished runs run again on
                    the other listener
==================  ========================================================================
"""

from __future__ import annotations

import os
import signal
import time

import redis

from bench.faults.ledger import (
    KILL_FLUSH_GRACE,
    Signal,
    completed,
    open_runs,
    read_ledger,
    runs_by_timer,
    starts,
)
from bench.faults.processes import (
    FaultError,
    child_pids,
    pid_running,
    wait_for,
)
from bench.faults.scenario import Fault, Scenario
from timers import TimersError

MIB = 1 << 20
OOM_HEADROOM = 2 * MIB
"""``maxmemory`` is set this far above the memory in use, then filled."""
OOM_MARGIN = 64 * 1024
"""Once full, the server is kept this far over its limit, so a freed key does not let a
write through."""
OOM_HOLD_S = 5.0
"""How long the server is kept at its limit: longer than the lease and the slow tasks."""
EVICT_HEADROOM = 1 * MIB
FILLER = "hostile-filler"
POISON_ID = "poison-0"
POISON_TASK = "hostile.poison"
BLOCKED_TASK = "hostile.blocked"
MAX_CRASHES = 3
"""The documented default of ``@task(max_crashes=...)``."""
BLOCKED_TIMERS = 2
DONE_TIMEOUT = 20.0
"""Seconds after the main batch's spread for every timer to complete (these faults are over
by then when the listener copes; when it does not, runs may repeat without end)."""
ORPHAN_TIMEOUT = 6.0
"""Seconds the children of a killed supervisor get to exit (their shutdown timeout is 1)."""


# -- a full server ----------------------------------------------------------------------


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def fill_until_refused(r: redis.Redis, name: str, size: int, most: int) -> int:
    """``SET`` keys without a TTL of ``size`` bytes until the server refuses one (OOM);
    how many it took. :class:`FaultError` if it took ``most``."""
    value = b"x" * size
    for i in range(most):
        try:
            r.set(f"{FILLER}:{name}:{i}", value)
        except redis.exceptions.OutOfMemoryError:
            return i
    raise FaultError(f"the server took {most} filler keys of {size} bytes without an OOM")


def delete_filler(r: redis.Redis) -> int:
    """Delete every filler key; how many there were."""
    deleted = 0
    batch: list[str] = []
    for key in r.scan_iter(match=f"{FILLER}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += int(r.unlink(*batch))
            batch.clear()
    if batch:
        deleted += int(r.unlink(*batch))
    return deleted


def hold_full(r: redis.Redis, seconds: float) -> tuple[int, int]:
    """Keep the server over its limit by at least ``OOM_MARGIN`` for ``seconds``: as runs
    and expiring keys free memory, ``maxmemory`` is lowered after it (a write landing in a
    freed gap would do the same, only less surely). Every round a write is tried and must
    be refused. Returns (limit lowered so many times, writes refused)."""
    lowered = refused = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        used, limit = used_memory(r), int(str(r.config_get("maxmemory")["maxmemory"]))
        if used - limit < OOM_MARGIN // 2:
            r.config_set("maxmemory", str(used - OOM_MARGIN))
            lowered += 1
        try:
            r.set(f"{FILLER}:probe", b"x")
        except redis.exceptions.OutOfMemoryError:
            refused += 1
        time.sleep(0.02)
    return lowered, refused


def lines_mentioning(s: Scenario, *words: str) -> int:
    """Listener log lines that mention any of ``words`` (case-insensitive)."""
    return sum(1 for listener in s.listeners for line in listener.log().splitlines()
               if any(word.lower() in line.lower() for word in words))


def inject_oom(s: Scenario) -> None:
    running = sum(len(open_runs(s.ledger, listener.pid)) for listener in s.listeners)
    limit = used_memory(s.r) + OOM_HEADROOM
    s.r.config_set("maxmemory", str(limit))
    big = fill_until_refused(s.r, "big", 64 * 1024, 10_000)
    small = fill_until_refused(s.r, "small", 1024, 100_000)
    full_at = time.time()
    lowered, refused = hold_full(s.r, OOM_HOLD_S / 2)
    try:
        s.timers.stats()
        stats = "timers stats read fine"
    except (redis.RedisError, TimersError) as exc:
        stats = f"timers stats failed ({exc})"
        s.problems.append(f"timers stats failed under OOM: {exc}")
    more_lowered, more_refused = hold_full(s.r, OOM_HOLD_S / 2)
    held = time.time() - full_at
    freed = delete_filler(s.r)
    s.r.config_set("maxmemory", str(limit))
    rounds = lowered + more_lowered
    due = sum(1 for d in s.due_ms.values() if full_at * 1000 <= d <= (full_at + held) * 1000)
    s.evidence.append(
        f"maxmemory {limit / MIB:.1f} MB (noeviction) filled with {big} x 64 KB + {small} x "
        f"1 KB keys, then kept {OOM_MARGIN // 1024} KB over its limit for {held:.1f} s "
        f"(limit lowered {rounds} times as memory freed; {refused + more_refused} test "
        f"writes refused) with {running} task(s) running and {due} timers coming due; "
        f"{stats} under OOM; then {freed} filler keys deleted, the limit back at "
        f"{limit / MIB:.1f} MB; listener log lines mentioning OOM/memory: "
        f"{lines_mentioning(s, 'OOM', 'memory')}")
    if not refused + more_refused:
        s.problems.append("no write was refused: the server was not at its limit")


# -- eviction ---------------------------------------------------------------------------


def expiring_keys(r: redis.Redis) -> int:
    """Keys with a TTL in db 0: the expiring keys of pending timers."""
    return int(r.info("keyspace").get("db0", {}).get("expires", 0))


def inject_evict_volatile(s: Scenario) -> None:
    before = expiring_keys(s.r)
    evicted_before = int(s.r.info("stats")["evicted_keys"])
    limit = used_memory(s.r) + EVICT_HEADROOM
    s.r.config_set("maxmemory", str(limit))
    value = b"x" * 4096
    written = 0
    refused = False
    while expiring_keys(s.r) > 0 and written < 20_000:
        try:
            s.r.set(f"{FILLER}:evict:{written}", value)
            written += 1
        except redis.exceptions.OutOfMemoryError:
            refused = True  # nothing with a TTL left to evict
            break
    left = expiring_keys(s.r)
    evicted = int(s.r.info("stats")["evicted_keys"]) - evicted_before
    freed = delete_filler(s.r)
    s.evidence.append(
        f"maxmemory {limit / MIB:.1f} MB, volatile-lru: {written} filler keys (4 KB, no TTL) "
        f"evicted {evicted} keys; expiring timer keys {before} -> {left}"
        f"{' (then a write was refused: OOM)' if refused else ''}; {freed} filler keys "
        f"deleted, the policy and limit kept")
    if evicted == 0:
        s.problems.append("no key was evicted: the fault was not injected")


# -- a poison task ----------------------------------------------------------------------


def start_supervised(s: Scenario) -> None:
    s.start_listener(processes=2)


def schedule_poison(s: Scenario, fault_at: float) -> None:
    s.schedule([(POISON_ID, fault_at, 0.0)], task=POISON_TASK)
    s.expected_failures.add(POISON_ID)


def poison_dead(s: Scenario) -> str | None:
    """The poison timer's failure record, as ``kind: message``, if it is recorded dead."""
    for failure in s.timers.failed(1000):
        if failure.timer_id == POISON_ID:
            return f"{failure.data.get('kind')}: {failure.data.get('message')}"
    return None


def poison_stopped(s: Scenario) -> bool:
    """The poison is dead, or it ran more than it may: stop watching either way."""
    return (len(starts(s.ledger, POISON_ID)) > MAX_CRASHES + 1
            or poison_dead(s) is not None)


def inject_poison(s: Scenario) -> None:
    begun = time.time()

    def stopped() -> bool:
        s.check_alive()
        return poison_stopped(s)

    wait_for(stopped, 30, "the poison timer to be recorded dead", interval=0.1)
    ran, took = len(starts(s.ledger, POISON_ID)), time.time() - begun
    s.evidence.append(f"the poison timer was recorded dead after {ran} runs ({took:.1f} s)"
                      if poison_dead(s) else
                      f"the poison timer was not recorded dead after {ran} runs ({took:.1f} "
                      f"s): the bench stopped waiting")


def poison_settled(s: Scenario) -> bool:
    if len(starts(s.ledger, POISON_ID)) > MAX_CRASHES + 1:
        return True  # it is not stopping; the judge says so
    return poison_dead(s) is not None and s.settled()


def judge_poison(s: Scenario) -> None:
    crashes = starts(s.ledger, POISON_ID)
    for mark in crashes:  # the process died with it: its other runs were cut short
        s.signals.append(Signal(mark.pid, "poison os._exit", mark.at + 0.05,
                                mark.at - KILL_FLUSH_GRACE))
    runs = runs_by_timer(read_ledger(s.ledger))
    with_it = {tid: sum(1 for run in mine if run.end is None) for tid, mine in runs.items()
               if tid != POISON_ID}
    with_it = {tid: n for tid, n in with_it.items() if n}
    if with_it:
        worst = max(with_it, key=with_it.__getitem__)
        s.evidence.append(f"{len(with_it)} other timers died with it (runs cut short; "
                          f"{worst} {with_it[worst]} times)")
    supervisor = s.listeners[0]
    restarts = supervisor.count_in_log("restarting")
    dead = poison_dead(s)
    if dead is not None:
        s.evidence.append(f"poison recorded dead after {len(crashes)} crashes ({dead})")
    else:
        s.problems.append(f"poison started {len(crashes)} times (each killed a listener) "
                          f"and was not recorded dead")
    if len(crashes) > MAX_CRASHES:
        s.problems.append(f"poison ran {len(crashes)} times, more than max_crashes "
                          f"{MAX_CRASHES}")
    s.evidence.append(f"the supervisor restarted {restarts} listener(s)"
                      + ("" if supervisor.alive() else
                         f" and exited {supervisor.process.returncode}"))


# -- a blocked event loop ---------------------------------------------------------------


def schedule_blocked(s: Scenario, fault_at: float) -> None:
    seconds = s.lease + 1.5
    s.schedule([(f"m-blocked-{i}", fault_at + i, seconds) for i in range(BLOCKED_TIMERS)],
               task=BLOCKED_TASK)


def inject_blocked(s: Scenario) -> None:
    ids = [f"m-blocked-{i}" for i in range(BLOCKED_TIMERS)]
    wait_for(lambda: all(starts(s.ledger, tid) for tid in ids), 15,
             "the blocking tasks to start")
    wait_for(lambda: completed(s.ledger, ids), BLOCKED_TIMERS * (s.lease + 1.5) + 15,
             "the blocking tasks to return")
    pids = sorted({mark.pid for tid in ids for mark in starts(s.ledger, tid)})
    s.evidence.append(
        f"{BLOCKED_TIMERS} async tasks blocked the event loop of listener(s) "
        f"{', '.join(map(str, pids))} for {s.lease + 1.5:g} s a run (--lease {s.lease:g}); "
        f"listener log lines mentioning a blocked loop: {lines_mentioning(s, 'block')}")


# -- the supervisor killed --------------------------------------------------------------


def start_supervisor_and_one(s: Scenario) -> None:
    s.start_listener(processes=2)
    s.start_listener()


def inject_supervisor_kill9(s: Scenario) -> None:
    supervisor = s.listeners[0]
    children = child_pids(supervisor.pid)
    running = sum(len(open_runs(s.ledger, pid)) for pid in children)
    sent = s.send(supervisor, signal.SIGKILL)
    supervisor.wait(10)
    exited: dict[int, float] = {}
    while time.time() < sent.at + ORPHAN_TIMEOUT and len(exited) < len(children):
        exited.update({pid: time.time() for pid in children
                       if pid not in exited and not pid_running(pid)})
        time.sleep(0.02)
    for pid, at in exited.items():  # however it died, its unfinished runs were cut short
        s.signals.append(Signal(pid, "supervisor killed", at, sent.at - KILL_FLUSH_GRACE,
                                 sent=sent.at))
    orphans = [pid for pid in children if pid not in exited]
    said = (f"kill -9 of the supervisor {supervisor.pid} with {running} task(s) running in "
            f"its {len(children)} children: ")
    if exited:
        said += f"{len(exited)} children exited after {max(exited.values()) - sent.at:.2f} s"
    if orphans:
        s.problems.append(f"{len(orphans)} of {len(children)} children still running "
                          f"{ORPHAN_TIMEOUT:g} s after the supervisor was killed")
        said += f"{'; ' if exited else ''}{len(orphans)} orphan(s) still running after " \
                f"{ORPHAN_TIMEOUT:g} s, killed by the bench"
        for pid in orphans:
            at = time.time()
            os.kill(pid, signal.SIGKILL)
            s.signals.append(Signal(pid, "SIGKILL (orphan)", at, at - KILL_FLUSH_GRACE))
        wait_for(lambda: not any(pid_running(pid) for pid in orphans), 10,
                 "the orphans to die")
    s.evidence.append(said)


HOSTILE_FAULTS: tuple[Fault, ...] = (
    Fault("oom", f"noeviction at maxmemory for {OOM_HOLD_S:g} s, tasks longer than the "
          f"lease", inject_oom, slow_every=20, slow_seconds=4.0, done_timeout=DONE_TIMEOUT),
    Fault("evict-volatile", "volatile-lru at maxmemory: timer keys evicted",
          inject_evict_volatile, server_args=("--maxmemory-policy", "volatile-lru"),
          done_timeout=DONE_TIMEOUT),
    Fault("poison", "a task that os._exit()s, --processes 2", inject_poison,
          start=start_supervised, extra=schedule_poison, judge=judge_poison,
          settled=poison_settled, done_timeout=DONE_TIMEOUT),
    Fault("blocked-loop", "async tasks that block the event loop past the lease",
          inject_blocked, extra=schedule_blocked, done_timeout=DONE_TIMEOUT),
    Fault("supervisor-kill9", "kill -9 of the --processes 2 supervisor",
          inject_supervisor_kill9, slow_every=10, slow_seconds=1.5, shutdown_timeout=1.0,
          start=start_supervisor_and_one, done_timeout=DONE_TIMEOUT),
)
