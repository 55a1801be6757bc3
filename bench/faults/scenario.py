"""One fault's run: a server, listener processes, the ledger and what is due when."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import redis

from bench.faults import ledger
from bench.faults.ledger import Signal, Verdict, analyse, completed, open_runs, read_ledger
from bench.faults.processes import (
    LISTENER_START_TIMEOUT,
    FaultError,
    ListenerProcess,
    subscribers,
    wait_for,
)
from timers import Failure, Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.keys import Keyspace

TASK = "ledger.mark"
PROBE_TASK = "probe.none"
"""A task path that resolves to nothing: a key naming it is recorded as rejected."""
ON_TIME_MS = 250.0
"""A final-batch timer that starts later than this after its due time is not on time."""

Due = tuple[str, float, float]
"""``(timer id, due wall-clock s, seconds the task works)``."""


OUTAGE_LOST = "connection to Redis lost"
"""A listener's log line when an outage starts (one per outage, naming the part that
noticed it first: "event subscription", "claims", ...)."""
OUTAGE_BACK = "connection to Redis back"
"""... and when it ends."""
SUBSCRIPTION_LOST = OUTAGE_LOST + " (event subscription)"

@dataclass(frozen=True)

class Plan:
    """Sizes of every scenario."""

    timers: int = 3_000
    spread_s: float = 10.0
    lead_s: float = 1.5
    final_timers: int = 200
    lease: float = 2.0
    concurrency: int = 100
    burst: int = 1_000
    keys: int = 0
    """Main-batch timers share this many concurrency keys, one run at a time each
    (``schedule(..., key=…)``); 0: no key."""

    @classmethod
    def quick(cls, timers: int | None = None, keys: int = 0) -> Plan:
        return cls(timers=timers or 600, spread_s=2.5, lead_s=1.0, final_timers=100,
                   burst=400, keys=keys)


@dataclass
class Result:
    """One line of the table."""

    fault: str
    main: Verdict | None = None
    final: Verdict | None = None
    evidence: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (not self.problems and self.main is not None and self.main.ok
                and self.final is not None and self.final.ok)


class Scenario:
    """One fault's run: a server, listener processes, the ledger and what is due when."""

    def __init__(self, server: EmbeddedServer, workdir: Path, plan: Plan,
                 shutdown_timeout: float = 5.0, lease: float | None = None) -> None:
        self.server = server
        self.workdir = workdir
        self.plan = plan
        self.shutdown_timeout = shutdown_timeout
        self.lease = plan.lease if lease is None else lease
        self.ledger = workdir / "ledger.txt"
        self.ledger.touch()
        self.r = redis.Redis.from_url(server.url, socket_timeout=15)
        self.timers = Timers(self.r)
        self.listeners: list[ListenerProcess] = []
        self.signals: list[Signal] = []
        self.due_ms: dict[str, int] = {}
        self.key_of: dict[str, str] = {}
        """The concurrency key of each keyed timer (:attr:`Plan.keys`)."""
        self.gone: dict[int, float] = {}
        """When a process a fault stopped was seen gone (wall-clock s), where it waited."""
        self.evidence: list[str] = []
        self.problems: list[str] = []
        """What the fault itself found wrong (beyond the ledger's verdict)."""
        self.expected_failures: set[str] = set()
        """Timer ids whose failure record the fault expects (not a problem)."""
        self.probes = 0

    def close(self) -> None:
        for listener in self.listeners:
            listener.kill()
        self.r.close()

    # listeners

    def start_listener(self, processes: int = 1) -> ListenerProcess:
        """A listener process, or with ``processes`` > 1 a ``--processes`` supervisor."""
        index = len(self.listeners)
        listener = ListenerProcess(
            self.server.url, self.ledger, self.workdir / f"listener-{index}.log",
            lease=self.lease, concurrency=self.plan.concurrency,
            shutdown_timeout=self.shutdown_timeout, processes=processes,
        )
        self.listeners.append(listener)
        return listener

    def live_listeners(self) -> list[ListenerProcess]:
        return [listener for listener in self.listeners if listener.alive()]

    def check_alive(self) -> None:
        """:class:`FaultError` if a listener exited other than by this script's signals."""
        for listener in self.listeners:
            if listener.process.poll() not in (None, 0, -signal.SIGKILL):
                raise FaultError(f"listener {listener.pid} exited "
                                 f"{listener.process.returncode}: {listener.last_words()}")

    def all_subscribed(self) -> bool:
        """Whether every live listener is subscribed to expired events (and no dead one)."""
        self.check_alive()
        live = self.live_listeners()
        # NUMSUB alone can count a subscription that is being torn down (redis-py
        # resubscribes a dropped connection before the listener replaces it), so a
        # listener that logged a lost subscription must also have logged it back
        return subscribers(self.r) == sum(listener.processes for listener in live) and all(
            listener.count_in_log(OUTAGE_LOST) == listener.count_in_log(OUTAGE_BACK)
            for listener in live)

    def wait_subscribed(self, timeout: float = LISTENER_START_TIMEOUT) -> None:
        wait_for(self.all_subscribed, timeout,
                 f"{len(self.live_listeners())} listener(s) to subscribe")

    def busiest_listener(self) -> ListenerProcess:
        """The live listener with the most tasks running now (by the ledger)."""
        return max(self.live_listeners(),
                   key=lambda listener: len(open_runs(self.ledger, listener.pid)))

    def send(self, listener: ListenerProcess, sig: signal.Signals) -> Signal:
        sent = listener.send(sig)
        self.signals.append(sent)
        return sent

    # timers

    def schedule(self, dues: Sequence[Due], task: str = TASK, keys: int = 0) -> None:
        """Schedule ``(id, due wall-clock s, task seconds)``; the task takes both. With
        ``keys``, the timers go round the concurrency keys ``k0``… one step further each
        round (so every ``keys``-th timer, e.g. each slow one, is not on one key)."""
        specs = []
        for n, (tid, due, seconds) in enumerate(dues):
            due_ms = round(due * 1000)
            self.due_ms[tid] = due_ms
            at = datetime.fromtimestamp(due_ms / 1000, UTC)
            key = f"k{(n + n // keys) % keys}" if keys else None
            if key is not None:
                self.key_of[tid] = key
            specs.append(TimerSpec(task, [tid, seconds], at=at, id=tid, key=key))
        self.timers.schedule_many(specs)

    def most_at_once_per_key(self) -> int:
        """The most runs of one concurrency key that overlapped, by the ledger. A run that
        never returned lasts until its process was seen gone, or else until a signal cut
        it short (SIGTERM: until the shutdown timeout), else to the ledger's end."""
        marks = read_ledger(self.ledger)
        last = max((mark.at for mark in marks), default=0.0)
        spans: dict[str, list[tuple[float, float]]] = {}
        for tid, runs in ledger.runs_by_timer(marks).items():
            key = self.key_of.get(tid)
            if key is None:
                continue
            for run in runs:
                if self._paused_in(run):
                    continue  # the run a stopped listener was in may overlap its rerun
                cut = [self.gone.get(run.pid, max(sig.at, sig.cutoff)) for sig in self.signals
                       if sig.pid == run.pid and run.start <= sig.at]
                end = run.end if run.end is not None else min(cut, default=last)
                spans.setdefault(key, []).append((run.start, end))
        return max((_most_at_once(found) for found in spans.values()), default=0)

    def _paused_in(self, run: ledger.RunRecord) -> bool:
        """Whether ``run`` was under way in a process the bench stopped (SIGSTOP): resumed,
        it goes on while its rerun runs elsewhere, an overlap the listener counts as a
        late finish (fencing keeps the process from starting anything new)."""
        return any(sig.name == "SIGSTOP" and sig.pid == run.pid and run.start <= sig.at
                   and (run.end is None or run.end >= sig.at) for sig in self.signals)

    def probe_events(self, timeout: float = 10.0) -> float:
        """Prove expired events reach the listeners: a key in the timers namespace that
        names no task expires by itself (``SET … PX``), and a listener must record it as a
        rejected timer. An event published while a subscription is being replaced is lost
        for good (pub/sub keeps nothing), so a probe is tried again, under a new id, every
        second until one gets through. Returns the seconds until one did."""
        begun = time.monotonic()
        deadline = begun + timeout
        while True:
            self.probes += 1
            tag = f"probe{self.probes}"
            self.r.set(f"{Keyspace().timer_key_start}{tag}:{PROBE_TASK}:[]", 1, px=20)
            until = min(time.monotonic() + 1.0, deadline)
            while time.monotonic() < until:
                if self.timers.get_failure(tag) is not None:
                    return time.monotonic() - begun
                time.sleep(0.02)
            if time.monotonic() >= deadline:
                raise FaultError(f"no expired event reached a listener in {timeout:g} s "
                                 f"(probe keys were not recorded as rejected)")

    def failures(self) -> list[Failure]:
        """Failure records other than the probes' and those the fault expects."""
        return [f for f in self.timers.failed(1000)
                if not (f.timer_id or "").startswith("probe")
                and f.timer_id not in self.expected_failures]

    def settled(self) -> bool:
        stats = self.timers.stats()
        return stats.pending == 0 and stats.running == 0

    def wait_done(self, tids: Iterable[str], timeout: float,
                  settled: Callable[[], bool] | None = None) -> None:
        """Until every timer in ``tids`` completed a run and nothing is pending or running
        (or ``settled()``); :class:`FaultError` at once if a listener died by itself."""
        wanted = list(tids)
        until = settled or self.settled

        def done() -> bool:
            self.check_alive()
            return completed(self.ledger, wanted) and until()

        wait_for(done, timeout, f"{len(wanted)} timers to complete", interval=0.1)

    def verdict(self, tids: Iterable[str]) -> Verdict:
        return analyse({tid: self.due_ms[tid] for tid in tids}, read_ledger(self.ledger),
                       self.signals)

    def main_ids(self) -> list[str]:
        """The main batch: every timer whose id starts with ``m``."""
        return [tid for tid in self.due_ms if tid.startswith("m")]


def _most_at_once(spans: Sequence[tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) that overlap; one that ends as another starts
    does not overlap it."""
    points = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    level = most = 0
    for _, step in points:
        level += step
        most = max(most, level)
    return most


def main_batch(plan: Plan, start: float, fault_at: float, slow_every: int,
               slow_seconds: float, burst: int) -> list[Due]:
    """The timers of a scenario: ``plan.timers`` spread evenly from ``start`` over
    ``plan.spread_s``, of which ``burst`` are all due together at ``fault_at``; every
    ``slow_every``-th one works ``slow_seconds``."""
    spread = plan.timers - burst
    out = []
    for i in range(plan.timers):
        due = start + plan.spread_s * i / max(spread, 1) if i < spread else fault_at
        seconds = slow_seconds if slow_every and i % slow_every == slow_every - 1 else 0.0
        out.append((f"m{i:06d}", due, seconds))
    return out


def final_batch(n: int, start: float) -> list[Due]:
    """``n`` quick timers spread over one second from ``start``."""
    return [(f"f{i:06d}", start + i / n, 0.0) for i in range(n)]


Inject = Callable[[Scenario], None]


@dataclass(frozen=True)
class Fault:
    """A fault: what it does, and the shape of the timers it is injected into."""

    name: str
    what: str
    inject: Inject
    slow_every: int = 20
    slow_seconds: float = 0.3
    burst: bool = False
    burst_delay: float = 0.0
    """Seconds after the fault time at which the burst is due."""
    shutdown_timeout: float = 5.0
    lease: float | None = None
    """``--lease`` of the listeners, if not the plan's: it must outlast a stall of Redis."""
    server_args: tuple[str, ...] = ()
    """More ``redis-server`` arguments (after the repository's ``redis.conf``)."""
    start: Inject | None = None
    """Starts the listeners (default: two listener processes)."""
    extra: Callable[[Scenario, float], None] | None = None
    """Schedules more timers, given the fault time (ids starting ``m`` join the main batch)."""
    judge: Inject | None = None
    """After the timers are done (or a deadline passed): adds the second runs the fault
    explains (:attr:`Scenario.signals`), evidence and problems."""
    done_timeout: float = 60.0
    """Seconds after the main batch's spread for every timer to complete: a guard against
    a hang, not a goal."""
    settled: Callable[[Scenario], bool] | None = None
    """When the scenario is over once its timers completed (default: nothing is pending
    and nothing runs)."""
