"""The nemesis: a seeded schedule of faults, one at a time, injected into the world.

==============  ===========================================================================
``kill``        ``kill -9`` of a listener process (a supervisor's child, which the
                supervisor replaces, or a plain listener, started again); its children
                (fork server, quarantine processes) are cut with it
``stop``        ``SIGSTOP`` of a listener process for 1.5 s past its lease or more, then
                ``SIGCONT``
``stops``       the same, three times in a row on one process, 1.5 s apart
``term``        ``SIGTERM`` of a listener process while slow timers run (their tasks take
                longer than its shutdown timeout): it hands them back and exits 0, and
                each runs again elsewhere as a counted rerun; it is started again (by its
                supervisor, or by the nemesis)
``child``       slow timers scheduled; once they run, their process is stopped until they
                run again elsewhere as reruns, each in a quarantine child (a process of
                its own); then one such child is stopped past the lease (its listener
                keeps the lease: nothing may run the timer meanwhile, so no cut is
                written) and another is killed (a death: its run goes on in a new child,
                one crash counted)
``poison``      a timer whose task ``os._exit``\\ s its process (dead after 3 crashes), due
                with 150 quick timers (what its process finished must not run again)
``partition``   the proxy in ``L1``'s path to Redis stops forwarding, connections open,
                for 1.5 s past the lease or more, then heals (one server only)
``restart``     ``SHUTDOWN`` (the AOF written), down 1 s, started again on its port
                (one server only)
``memory``      ``maxmemory`` just above the memory in use with ``noeviction``, filled
                until writes are refused and kept full 3 s; then freed
``failover``    ``kill -9`` of the Sentinel deployment's primary: the replica is promoted
                (Sentinel only)
``migrate``     the slot of the timers' hash tag moved to another primary, key by key
                (Cluster only)
``primary``     ``kill -9`` of the primary that holds the timers' slot: its replica takes
                over (Cluster only); the other primaries refuse commands too, from when
                they mark it failed until its replica serves its slots (Redis's default
                ``cluster-require-full-coverage yes``), and that moment is written down
==============  ===========================================================================

Each fault writes down when it began and ended and which processes it cut
(:class:`bench.chaos.checker.Cut`), the checker's evidence for a second start.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.chaos.checker import EVERY, Cut
from bench.chaos.history import read_ledger
from bench.chaos.world import ON_TARGET, PROXIED, World, descendants
from bench.faults.hostile import (
    OOM_HEADROOM,
    delete_filler,
    fill_until_refused,
    hold_full,
    used_memory,
)
from bench.faults.processes import wait_for

SINGLE = ("kill", "stop", "stops", "child", "term", "poison", "partition", "restart",
          "memory")
SENTINEL = ("kill", "stop", "stops", "child", "term", "poison", "memory", "failover")
CLUSTER = ("kill", "stop", "stops", "child", "term", "poison", "migrate", "primary")
FAULTS = {"server": SINGLE, "sentinel": SENTINEL, "cluster": CLUSTER}
"""The faults each topology can take."""
OUTAGES = ("restart", "failover", "migrate", "primary")
"""Faults that put Redis out of every listener's reach for a while."""
MEMORY_HOLD_S = 3.0
TERM_WAIT_S = 3.0
"""How long a ``term`` fault waits for a slow timer to start (then it hits any process)."""
CHILD_WAIT_S = 10.0
"""How long a ``child`` fault waits for the reruns to start in quarantine children."""
RESTART_DOWN_S = 1.0


@dataclass(frozen=True)
class Planned:
    """A fault of the seeded schedule."""

    at: float
    """Seconds from the start (a fault never starts before the one ahead of it ended)."""
    kind: str
    pick: float
    """Which process or node it hits: an index into the candidates, as a fraction."""
    hold: float
    """Seconds it lasts (a stop, a partition)."""


def schedule(seed: int, seconds: float, kinds: tuple[str, ...], lease: float,
             gap: tuple[float, float]) -> list[Planned]:
    """The seeded fault schedule of a run of ``seconds``: one fault, then a gap, … Kinds
    come in rounds, each round every kind once in a shuffled order."""
    rng = random.Random(f"nemesis-{seed}")
    out: list[Planned] = []
    t = 8.0
    round_: list[str] = []
    while t < seconds - 15.0:
        if not round_:
            round_ = list(kinds)
            rng.shuffle(round_)
        kind = round_.pop()
        hold = round(rng.uniform(lease + 1.5, 2.5 * lease + 1.0), 2)
        out.append(Planned(round(t, 2), kind, rng.random(), hold))
        lasts = {"stop": hold, "partition": hold, "stops": 3 * hold + 3.0,
                 "child": hold + 6.0}.get(kind, 3.0)
        t += lasts + rng.uniform(*gap)
    return out


@dataclass
class Injected:
    """A fault as it was injected: monotonic start and end, what it hit."""

    kind: str
    start: float
    end: float
    what: str


@dataclass
class Nemesis:
    """Runs the schedule in a thread of its own; :meth:`stop` heals and waits."""

    world: World
    planned: list[Planned]
    schedule_poison: Callable[[], str]
    """Schedules a poison timer (the runner's); its id."""
    schedule_slow: Callable[[], str]
    """Schedules timers whose tasks outlast a listener's shutdown timeout (the runner's);
    the prefix of their ids."""
    cuts: list[Cut] = field(default_factory=list)
    injected: list[Injected] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    revived: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _idle: threading.Event = field(default_factory=threading.Event)
    _closed: threading.Event = field(default_factory=threading.Event)
    _settled: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _begun: float = 0.0
    _every_shard_down: float | None = None
    """Set by a primary's kill: when every shard began to refuse commands (monotonic)."""

    def start(self, begun: float) -> None:
        """Run the schedule from monotonic ``begun`` on, in a thread."""
        self._begun = begun
        self._thread = threading.Thread(target=self._live, name="nemesis", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No more faults: the one under way ends early (healed), none starts."""
        self._stop.set()
        if self._thread is not None:
            self._idle.wait(120)

    def settle(self) -> None:
        """Start no listener again from now on (they are being stopped)."""
        self._settled.set()

    def close(self) -> None:
        """End the thread. A process started on Linux with a parent-death signal dies with
        the thread that started it, so the thread that restarts servers and listeners
        lives until the run is over."""
        self._stop.set()
        self._closed.set()
        if self._thread is not None:
            self._thread.join(120)

    def _live(self) -> None:
        try:
            self._run()
        finally:
            self._idle.set()
        while not self._closed.wait(0.5):
            if not self._settled.is_set():
                self._revive()  # through the drain too

    def counts(self) -> Counter[str]:
        """Faults injected, by kind."""
        return Counter(i.kind for i in self.injected)

    def _run(self) -> None:
        for fault in self.planned:
            if self._wait_until(self._begun + fault.at):
                break
            start = time.monotonic()
            try:
                what = self._handlers()[fault.kind](fault)
            except Exception as exc:  # a fault that could not be injected is a finding
                self.problems.append(f"{fault.kind} at {start - self._begun:.1f} s: "
                                     f"{type(exc).__name__}: {exc}")
                what = None
            end = time.monotonic()
            if fault.kind in OUTAGES:
                # leases may lapse while no listener can renew them (and for a lease
                # after, while they reconnect): what ran then may run again
                self.cuts.extend(outage_cuts(start, end, self._every_shard_down,
                                             self.world.lease))
            self._every_shard_down = None
            if what is not None:
                self.injected.append(Injected(fault.kind, start, end, what))

    def _wait_until(self, when: float) -> bool:
        """Wait until monotonic ``when``, starting again any plain listener that died
        meanwhile (a poison's first run is in a listener's own process); True if told to
        stop."""
        while True:
            self._revive()
            left = when - time.monotonic()
            if left <= 0:
                return self._stop.is_set()
            if self._stop.wait(min(left, 0.5)):
                return True

    def _revive(self) -> None:
        for lid, code in self.world.revive():
            self.revived.append(f"{lid} exited {code} by itself (a poison?): started again")

    # processes

    def _victim(self, fault: Planned) -> tuple[str, int]:
        targets = self.world.targets()
        if not targets:
            raise RuntimeError("no listener process to hit")
        return targets[min(int(fault.pick * len(targets)), len(targets) - 1)]

    def _kill(self, fault: Planned) -> str:
        lid, pid = self._victim(fault)
        under = descendants(pid)
        at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        gone = self._gone({pid} | under, 10.0, f"kill -9 of {lid} pid {pid}")
        # SIGKILL ends the process at once; its children (fork server, quarantine
        # processes) go on until they notice, and a run in one holds its key until then
        self.cuts.append(Cut("kill", at, at, frozenset({pid})))
        if under:
            self.cuts.append(Cut("kill", at, gone, frozenset(under)))
        if lid in (PROXIED, ON_TARGET):
            self.world.restart_listener(lid)
        return f"{lid} pid {pid} (+{len(under)} children)"

    def _term(self, fault: Planned) -> str:
        """SIGTERM while slow timers run: the listener lets its tasks run for its shutdown
        timeout, hands back the runs still going and exits; until it is gone, any run in
        it (or in its children) may be cut."""
        with self.world.writes:
            batch = self.schedule_slow()
        lid, pid = self._running_slow(batch) or self._victim(fault)
        under = descendants(pid)
        at = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        gone = self._gone({pid} | under, 30.0, f"SIGTERM of {lid} pid {pid}")
        self.cuts.append(Cut("term", at, gone, frozenset({pid} | under)))
        if lid in (PROXIED, ON_TARGET):
            self.world.restart_listener(lid)
        return (f"{lid} pid {pid} (+{len(under)} children) after slow timers {batch}…, gone "
                f"in {gone - at:.1f} s")

    def _gone(self, pids: set[int], timeout: float, what: str) -> float:
        """Monotonic s when none of ``pids`` runs any more; those still running after
        ``timeout`` are a problem, and are killed."""
        gone = self.world.gone(pids, timeout)
        if gone is None:
            left = sorted(p for p in pids if _running(p))
            self.problems.append(f"{what}: {left} still ran {timeout:g} s later")
            for p in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            gone = self.world.gone(set(left), 10.0) or time.monotonic()
        return gone

    def _running_slow(self, batch: str) -> tuple[str, int] | None:
        """The target process running the most slow timers of ``batch`` (their ids'
        prefix), once one started (within :data:`TERM_WAIT_S`); None if none did."""
        deadline = time.monotonic() + TERM_WAIT_S
        while not self._stop.wait(0.1) and time.monotonic() < deadline:
            marks = read_ledger(self.world.ledger)
            ended = {m.tid for m in marks if m.kind == "E"}
            pids = Counter(m.pid for m in marks if m.kind == "S"
                           and m.tid.startswith(batch) and m.tid not in ended)
            running = [(pids[pid], lid, pid) for lid, pid in self.world.targets() if pids[pid]]
            if running:
                _, lid, pid = max(running)
                return lid, pid
        return None

    def _fresh(self) -> float:
        """How long into a pause, partition or outage a run may still start: its lease
        (renewed last before it began), and a little for the clocks."""
        return fresh_for(self.world.lease)

    def _handlers(self) -> dict[str, Callable[[Planned], str]]:
        return {"kill": self._kill, "stop": self._pause, "stops": self._pauses,
                "child": self._child,
                "term": self._term, "poison": self._poison,
                "partition": self._partition, "restart": self._restart,
                "memory": self._memory, "failover": self._failover,
                "migrate": self._migrate, "primary": self._primary}

    def _pause(self, fault: Planned) -> str:
        lid, pid = self._victim(fault)
        under = descendants(pid)
        at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        self._stop.wait(fault.hold)
        os.kill(pid, signal.SIGCONT)
        self.cuts.append(Cut("stop", at, time.monotonic(), frozenset({pid} | under),
                                fresh_for=self._fresh()))
        return f"{lid} pid {pid} for {fault.hold:g} s"

    def _pauses(self, fault: Planned) -> str:
        """The same process stopped past its lease three times, 1.5 s apart (a VM that
        keeps freezing): its runs' leases lapse each time while it lives."""
        lid, pid = self._victim(fault)
        done = 0
        for _ in range(3):
            if not _running(pid) or self._stop.is_set():
                break
            under = descendants(pid)
            at = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            self._stop.wait(fault.hold)
            os.kill(pid, signal.SIGCONT)
            self.cuts.append(Cut("stop", at, time.monotonic(), frozenset({pid} | under),
                                fresh_for=self._fresh()))
            done += 1
            self._stop.wait(1.5)
        return f"{lid} pid {pid} {done} times for {fault.hold:g} s"

    def _child(self, fault: Planned) -> str:
        """Quarantine children hit (see the module docstring)."""
        with self.world.writes:
            batch = self.schedule_slow()
        hit = self._running_slow(batch)
        if hit is None:
            return f"slow timers {batch}…: none started"
        lid, pid = hit
        under = descendants(pid)
        at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            # past the lease: its slow runs are claimed again, as reruns, elsewhere
            children = self._quarantined(batch, {pid} | under, at + CHILD_WAIT_S)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.cuts.append(Cut("stop", at, time.monotonic(), frozenset({pid} | under),
                                 fresh_for=self._fresh()))
        if not children:
            return f"{lid} pid {pid} stopped; no rerun started in a quarantine child"
        stopped = children[0]
        os.kill(stopped, signal.SIGSTOP)
        self._stop.wait(fault.hold)
        os.kill(stopped, signal.SIGCONT)
        what = (f"{lid} pid {pid} stopped; quarantine child {stopped} stopped for "
                f"{fault.hold:g} s")
        alive = [c for c in children[1:] if _running(c)]
        if alive:
            at = time.monotonic()
            os.kill(alive[0], signal.SIGKILL)
            gone = self._gone({alive[0]}, 10.0, f"kill -9 of quarantine child {alive[0]}")
            self.cuts.append(Cut("kill", at, gone, frozenset({alive[0]})))
            what += f", child {alive[0]} killed"
        return what

    def _quarantined(self, batch: str, away: set[int], deadline: float) -> list[int]:
        """The processes running a slow timer of ``batch`` that are neither a listener nor
        under one of ``away``: quarantine children, once at least two run (or at
        ``deadline``, those seen)."""
        listeners = {pid for _, pid in self.world.targets()}
        found: list[int] = []
        while not self._stop.wait(0.05) and time.monotonic() < deadline:
            marks = read_ledger(self.world.ledger)
            ended = {(m.tid, m.pid) for m in marks if m.kind == "E"}
            found = []
            for m in marks:
                if (m.kind == "S" and m.tid.startswith(batch) and (m.tid, m.pid) not in ended
                        and m.pid not in listeners and m.pid not in away
                        and m.pid not in found and _running(m.pid)):
                    found.append(m.pid)
            if len(found) >= 2:
                break
        return found

    def _poison(self, fault: Planned) -> str:
        with self.world.writes:
            return self.schedule_poison()

    def _partition(self, fault: Planned) -> str:
        proxy = self.world.proxy
        if proxy is None:
            raise RuntimeError("no proxy: a partition needs one server")
        at = time.monotonic()
        proxy.partition()
        try:
            self._stop.wait(fault.hold)
        finally:
            proxy.heal()
        self.cuts.append(Cut("partition", at, time.monotonic(), listener=PROXIED,
                             fresh_for=self._fresh()))
        return f"{PROXIED} cut off {fault.hold:g} s"

    # servers

    def _restart(self, fault: Planned) -> str:
        server = self.world.server
        if server is None:
            raise RuntimeError("a restart needs one server")
        with self.world.writes:
            stopped = time.monotonic()
            with redis.Redis(port=server.port, socket_timeout=10) as r, \
                    contextlib.suppress(redis.ConnectionError):
                r.shutdown()
            time.sleep(max(0.0, stopped + RESTART_DOWN_S - time.monotonic()))
            try:
                server.restart()
            except RuntimeError as exc:
                log = Path(server.data_dir) / "server.log"
                tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
                raise RuntimeError(f"{exc}: {' | '.join(tail)}") from None
            return f"down {time.monotonic() - stopped:.2f} s"

    def _memory(self, fault: Planned) -> str:
        with self.world.writes, self.world.client() as r:
            policy = str(r.config_get("maxmemory-policy")["maxmemory-policy"])
            before = str(r.config_get("maxmemory")["maxmemory"])
            r.config_set("maxmemory-policy", "noeviction")
            limit = used_memory(r) + OOM_HEADROOM
            r.config_set("maxmemory", str(limit))
            try:
                big = fill_until_refused(r, "big", 64 * 1024, 10_000)
                small = fill_until_refused(r, "small", 1024, 100_000)
                _, refused = hold_full(r, MEMORY_HOLD_S)
            finally:
                freed = delete_filler(r)
                r.config_set("maxmemory", before)
                r.config_set("maxmemory-policy", policy)
            return (f"{big} x 64 KB + {small} x 1 KB filler, full {MEMORY_HOLD_S:g} s "
                    f"({refused} test writes refused), {freed} keys freed")

    def _failover(self, fault: Planned) -> str:
        deployment = self.world.deployment
        if deployment is None:
            raise RuntimeError("a failover needs Sentinel")
        with self.world.writes:
            old = deployment.primary_port()
            server = deployment.server_on(old)
            _kill_replicated(old, server.pid or 0)
            wait_for(lambda: deployment.primary_port() != old, 60,
                     "the sentinels to promote the replica")
            server.restart()  # back, as the new primary's replica (sentinels reconfigure it)
            return f"primary on {old} killed, now {deployment.primary_port()}"

    def _migrate(self, fault: Planned) -> str:
        from tests.clusters import live_primaries, migrate_slot, slot_owner
        cluster = self.world.cluster
        if cluster is None:
            raise RuntimeError("a slot migration needs a Cluster")
        slot = _slot(self.world, fault.pick)
        owner = slot_owner(cluster, slot)
        others = [p for p in live_primaries(cluster) if p is not owner]
        to = others[min(int(fault.pick * len(others)), len(others) - 1)]
        moved = migrate_slot(cluster, slot, to.port, batch=50)
        return f"slot {slot}: {moved} keys from {owner.port} to {to.port}"

    def _primary(self, fault: Planned) -> str:
        from tests.clusters import live_primaries, slot_owner
        cluster = self.world.cluster
        if cluster is None:
            raise RuntimeError("a primary kill needs a Cluster")
        slot = _slot(self.world, fault.pick)
        owner = slot_owner(cluster, slot)
        def promoted() -> bool:
            try:
                return slot_owner(cluster, slot) is not owner
            except StopIteration:  # nobody serves it yet
                return False

        others = [p for p in live_primaries(cluster) if p is not owner]
        down: list[float] = []

        def served() -> bool:
            # with cluster-require-full-coverage (Redis's default), every primary refuses
            # commands once the others mark the dead one failed, until its replica serves
            # its slots: from then on no lease on any shard can be renewed
            states = [_cluster_state(p.port) for p in others]
            if "fail" in states and not down:
                down.append(time.monotonic())
            return promoted() and all(state == "ok" for state in states)

        with self.world.writes:  # the workload's writes wait for the new primary
            _kill_replicated(owner.port, owner.pid or 0)
            killed_at = time.monotonic()
            wait_for(served, 60, "a replica to take over the killed primary's slots")
        self._every_shard_down = down[0] if down else None
        owner.restart()  # back, as a replica
        every = (f", every shard refused from {self._every_shard_down - killed_at:.1f} s"
                 if self._every_shard_down is not None else "")
        return f"primary {owner.port} killed, its replica took over{every}"


def fresh_for(lease: float) -> float:
    """How long into a pause, partition or outage a run may still start: its lease (renewed
    last before it began), and a little for the clocks."""
    return lease + 0.25


def stall_cuts(stalls: Iterable[tuple[int, float, float]], lease: float) -> list[Cut]:
    """The stalls of processes (:mod:`bench.fault_tasks.stall_watch`: process, from, to)
    that may have let a lease lapse, as cuts of that process. Renewals go out every third
    of a lease, so a lease lapses in a stall of over two thirds of one; every stall of half
    a lease or more is a cut (one the nemesis caused with a ``SIGSTOP`` is a cut already,
    and its stall changes nothing)."""
    return [Cut("stall", start, end, frozenset({pid}), fresh_for=fresh_for(lease))
            for pid, start, end in stalls if end - start >= lease / 2]


def outage_cuts(start: float, end: float, every_shard_down: float | None,
                lease: float) -> list[Cut]:
    """The cuts of an outage from ``start`` to ``end`` (monotonic): every listener, until a
    lease after its end (they reconnect), a run starting up to a lease into it. When every
    shard of a Cluster began to refuse commands later than the fault began
    (``every_shard_down``: a primary's death, once the others mark it failed), the leases
    on the healthy shards were renewed until then, and the outage of those starts there."""
    cuts = [Cut("outage", start, end + lease, listener=EVERY, fresh_for=fresh_for(lease))]
    if every_shard_down is not None and every_shard_down > start:
        cuts.append(Cut("outage", every_shard_down, end + lease, listener=EVERY,
                        fresh_for=fresh_for(lease)))
    return cuts


def _cluster_state(port: int) -> str:
    """``ok``, ``fail`` (the node refuses commands) or ``?`` (no answer)."""
    try:
        with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as r:
            info = str(r.execute_command("CLUSTER", "INFO"))
    except (redis.RedisError, OSError):
        return "?"
    return "ok" if "cluster_state:ok" in info else "fail" if "cluster_state:fail" in info else "?"


def _kill_replicated(port: int, pid: int) -> None:
    """``kill -9`` of the primary on ``port`` once its replica has every write: writes
    paused (``CLIENT PAUSE … WRITE``), ``WAIT 1``, then the kill. What a client was told
    is written survives the failover (asynchronous replication loses nothing here: the
    checker's findings are the listeners', not the replication's)."""
    with redis.Redis(port=port, socket_timeout=10) as r:
        r.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        if int(r.execute_command("WAIT", 1, 5000)) < 1:
            r.execute_command("CLIENT", "UNPAUSE")
            raise RuntimeError(f"the replica of {port} did not catch up")
    os.kill(pid, signal.SIGKILL)


def _slot(world: World, pick: float) -> int:
    """A slot that holds timers: a random key's, on the primary ``pick`` chooses (a
    prefix is split into a shard per primary, each under a hash tag of its own)."""
    from tests.clusters import live_primaries
    assert world.cluster is not None
    primaries = live_primaries(world.cluster)
    node = primaries[min(int(pick * len(primaries)), len(primaries) - 1)]
    with redis.Redis(port=node.port) as r:
        key = r.randomkey() or world.source
        return int(r.execute_command("CLUSTER", "KEYSLOT", key))


def _running(pid: int) -> bool:
    from bench.faults.processes import pid_running
    return pid_running(pid)
