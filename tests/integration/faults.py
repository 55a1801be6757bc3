"""What the fault tests need: an own server, ``timers listen`` processes whose task writes
a file ledger, and what that ledger says (which timers ran, how often, how late).

The ledger is a file because the faults hit Redis: whatever happens to it, the file keeps
every run. Each run appends ``S id pid time`` as it starts and ``E id pid time`` when it
returns (see :mod:`tests.fault_tasks.ledger`).
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, poll
from tests.fault_tasks.ledger import LEDGER_ENV
from tests.integration.helpers import subprocess_env
from timers import Failure, Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.keys import Keyspace

TASK = "ledger.mark"
PROBE_TASK = "probe.none"
"""A task path that resolves to nothing: a key naming it is recorded as rejected."""
Due = tuple[str, float, float]
"""``(timer id, due wall-clock s, seconds the task works)``."""


@dataclass(frozen=True)
class Plan:
    timers: int
    spread_s: float
    lead_s: float
    final_timers: int
    lease: float
    concurrency: int


@dataclass
class RunRecord:
    """One run of a timer: where it ran, when it started and (if it did) ended."""

    pid: int
    start: float
    end: float | None = None


def read_ledger(path: Path) -> list[tuple[str, str, int, float]]:
    """Every complete ``(kind, timer id, pid, time)`` line, in the order written."""
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    return [(kind, tid, int(pid), float(at)) for kind, tid, pid, at in
            (line.split() for line in lines if line.endswith("\n") and len(line.split()) == 4)]


def runs_by_timer(path: Path) -> dict[str, list[RunRecord]]:
    """The runs of each timer in start order, each start paired with its end."""
    runs: dict[str, list[RunRecord]] = defaultdict(list)
    running: dict[tuple[str, int], list[RunRecord]] = defaultdict(list)
    for kind, tid, pid, at in read_ledger(path):
        if kind == "S":
            runs[tid].append(RunRecord(pid, at))
            running[tid, pid].append(runs[tid][-1])
        elif running[tid, pid]:
            running[tid, pid].pop(0).end = at
    return dict(runs)


@dataclass
class Verdict:
    """What the ledger says about some timers: ``lost`` never completed a run; ``reruns``
    are starts beyond the first, by timer; lateness is first start minus due time."""

    timers: int
    lost: list[str]
    reruns: dict[str, int]
    lateness_ms: list[float] = field(default_factory=list)

    @property
    def fired(self) -> int:
        return self.timers - len(self.lost)


class ListenerProcess:
    """``timers listen`` in a child process running :mod:`tests.fault_tasks`."""

    def __init__(self, url: str, ledger: Path, log_path: Path, *, lease: float,
                 concurrency: int, shutdown_timeout: float) -> None:
        env = subprocess_env()
        env["PYTHONUNBUFFERED"] = "1"
        env[LEDGER_ENV] = str(ledger)
        self.log_path = log_path
        with log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "timers", "listen", "--url", url,
                 "--tasks", "tests.fault_tasks", "--concurrency", str(concurrency),
                 "--lease", str(lease), "--shutdown-timeout", str(shutdown_timeout),
                 "--log-level", "info"],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def count_in_log(self, text: str) -> int:
        return self.log().count(text)

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(10)


class Scenario:
    """One fault test: its server, listener processes, the ledger and what is due when."""

    def __init__(self, server: EmbeddedServer, workdir: Path, plan: Plan,
                 shutdown_timeout: float, lease: float) -> None:
        self.server, self.workdir, self.plan = server, workdir, plan
        self.shutdown_timeout, self.lease = shutdown_timeout, lease
        self.ledger = workdir / "ledger.txt"
        self.ledger.touch()
        self.r = redis.Redis.from_url(server.url, socket_timeout=15)
        self.timers = Timers(self.r)
        self.listeners: list[ListenerProcess] = []
        self.due_ms: dict[str, int] = {}
        self.probes = 0

    def close(self) -> None:
        for listener in self.listeners:
            listener.kill()
        self.r.close()

    def start_listener(self) -> ListenerProcess:
        listener = ListenerProcess(
            self.server.url, self.ledger, self.workdir / f"listener-{len(self.listeners)}.log",
            lease=self.lease, concurrency=self.plan.concurrency,
            shutdown_timeout=self.shutdown_timeout)
        self.listeners.append(listener)
        return listener

    def all_subscribed(self) -> bool:
        """Every live listener subscribed to expired events, none still reconnecting."""
        live = [listener for listener in self.listeners if listener.alive()]
        ((_, count),) = self.r.pubsub_numsub(Keyspace.expired_channel(0))
        return int(count) == len(live) and all(
            listener.count_in_log("connection to Redis lost")
            == listener.count_in_log("connection to Redis back") for listener in live)

    def probe_events(self, timeout: float = 10.0) -> None:
        """Prove expired events reach a listener: a key in the timers namespace naming no
        task expires by itself and must be recorded as rejected. A probe published while
        a subscription is being replaced is lost, so a new one goes every second."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.probes += 1
            tag = f"probe{self.probes}"
            self.r.set(f"{Keyspace().timer_key_start}{tag}:{PROBE_TASK}:[]", 1, px=20)
            if poll(functools.partial(self.timers.get_failure, tag),
                    min(1.0, deadline - time.monotonic())):
                return
        pytest.fail(f"no expired event reached a listener in {timeout:g} s")

    def send(self, listener: ListenerProcess, sig: signal.Signals) -> float:
        """Send ``sig``; the wall-clock time it was sent."""
        at = time.time()
        listener.process.send_signal(sig)
        return at

    def schedule(self, dues: Sequence[Due]) -> None:
        specs = []
        for tid, due, seconds in dues:
            self.due_ms[tid] = round(due * 1000)
            at = datetime.fromtimestamp(self.due_ms[tid] / 1000, UTC)
            specs.append(TimerSpec(TASK, [tid, seconds], at=at, id=tid))
        self.timers.schedule_many(specs)

    def verdict(self, tids: Iterable[str]) -> Verdict:
        runs = runs_by_timer(self.ledger)
        wanted = list(tids)
        lost = [tid for tid in wanted if not any(r.end is not None for r in runs.get(tid, []))]
        reruns = {tid: len(runs[tid]) - 1 for tid in wanted if len(runs.get(tid, [])) > 1}
        late = [runs[tid][0].start * 1000 - self.due_ms[tid] for tid in wanted if tid in runs]
        return Verdict(len(wanted), lost, reruns, late)

    def failures(self) -> list[Failure]:
        """Failure records other than the probes'."""
        return [f for f in self.timers.failed(1000)
                if not (f.timer_id or "").startswith("probe")]

    def settled(self) -> bool:
        stats = self.timers.stats()
        return stats.pending == 0 and stats.running == 0


def main_batch(plan: Plan, start: float, burst_at: float, slow_every: int,
               slow_seconds: float, burst: int) -> list[Due]:
    """``plan.timers`` timers spread from ``start`` over ``plan.spread_s``, of which
    ``burst`` are due together at ``burst_at``; every ``slow_every``-th works longer."""
    spread = plan.timers - burst
    out = []
    for i in range(plan.timers):
        due = start + plan.spread_s * i / max(spread, 1) if i < spread else burst_at
        seconds = slow_seconds if i % slow_every == slow_every - 1 else 0.0
        out.append((f"m{i:06d}", due, seconds))
    return out


def final_batch(n: int, start: float) -> list[Due]:
    """``n`` quick timers spread over one second from ``start``."""
    return [(f"f{i:06d}", start + i / n, 0.0) for i in range(n)]


def subscription_losses(s: Scenario) -> int:
    return sum(listener.count_in_log("connection to Redis lost (event subscription)")
               for listener in s.listeners)


def expire_together(r: redis.Redis, n: int, px: int) -> None:
    """``n`` keys outside the timers namespace that expire together in ``px`` ms."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"filler:{i}", 1, px=px)
    pipe.execute()
