"""A model of timers' flow control for ``test_model_flow.py``: the real Lua scripts on
fakeredis, driven through :class:`timers.store.scripts.Scripts` by virtual listeners that do
with each reply what ``timers/listener/*`` does, on a virtual Redis clock; and the model's
own history of every run, against which every reply of Redis is judged.

The model is its own oracle. It decides from what it did (scheduled, claimed with which
token and lease deadline, renewed, started, ended, cancelled, killed) which runs are live,
and compares Redis's answers with that, never the other way round: a claim may recover
only a run whose lease the model reckons lapsed, a finish is late exactly when the model
knows its run was taken over, a renewal keeps exactly the runs the model holds, and a
timer runs a second time only after a cut (a recovery). Every history ends drained
(:meth:`World.drain`): every timer ended as the model says, and nothing left in Redis.

The Redis clock. The scripts read time with ``redis.call('TIME')`` and fakeredis answers
that (and expires keys) from ``time.time()``, read in two of its modules. :func:`redis_clock`
swaps the ``time`` name of those two modules (and of ``timers/listener/leases.py``, whose
monotonic clock the fence reads) for a shim whose ``time()`` and ``monotonic()`` are a
:class:`VirtualClock`: the scripts run unchanged, no test sleeps, and a lease lapses when
the model moves the clock on.

A virtual listener mirrors the real one, and uses its real lease classes
(``timers/listener/leases.py``: :class:`HeldRuns` holds its runs, :class:`LeaseKeeper`
``renew_once`` renews them, :class:`Fence` decides whether a run may start):

- claim (``finding/claimer.py``): the runs of the reply are kept; one read late (more than half a
  lease after it was sent: here, after the listener was paused) is renewed first
  (``leases.still_held``) and only those still held are kept;
- start (``executor.py``): waits until the run's ``due_ms``; a run with a concurrency key
  or a rate limit asks ``gate.lua`` (``flow_gate.admit``) unless it was handed over holding
  its key's slot with no rate limit; "go" starts it, anything else drops it (no ending);
  a rerun (reruns >= 1: a lapse, never a crash) is queued for a quarantine child, which
  starts it later (:meth:`World.child_start`) only while the lease the parent shares with
  it (``HeldRuns.share``) holds (``leases.fresh_in``); a child that dies in its run is a
  death the parent sees: it runs the rerun again in a new child until those deaths reach
  the task's limit, then ends it dead (``crashes.died_outcome``);
- finish (``endings/writer.py`` / ``flow/handoff.py``): the ending goes with a taker of one run per
  key slot it frees (``follow`` on); the handed runs start (a handed one read late is
  renewed first), a run next in line waits for the run before it;
- a run next in line (``flow/turns.py`` / ``calling/runner.py``): starts the moment the run
  before it returns, in the same thread, before that run's ending is written;
- renewals (``leases.py`` ``LeaseKeeper.renew_once``): a token found lost is no longer
  renewed, nothing else;
- a stop (``lanes.py`` ``Lane.drain``): the runs not started are handed back, the runs
  still going past the shutdown timeout are handed back with a grace (cut: the process
  exits with them), and their next start is a counted rerun.

With ``fenced`` the listener is the one the design asks for (invariant 12): it starts any
run only after a renewal finds its lease still held. With ``local_fence`` it is the one in
``timers/listener``: ``Fence.fresh`` (half a lease from the reply that gave it the run, a
lease from each renewal that kept it, less a tenth) and ``Fence.revalidate`` after a
stall. With neither, it is the listener before the fence (it renews first only a claim
read more than half a lease late).
"""

from __future__ import annotations

import copy
import inspect
import time as real_time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import fakeredis._socket._base as fake_base
import fakeredis.commands_mixins.server_mixin as fake_server
from fakeredis._commands import SUPPORTED_COMMANDS, Signature
from fakeredis._socket._fakesocket import FakeSocket

from timers.listener import leases
from timers.listener.finding.claimer import KnownKeys
from timers.listener.lanes import HAND_BACK_GRACE_MS
from timers.listener.leases import Fence, HeldRuns, LeaseKeeper, fresh_in
from timers.listener.quarantine.crashes import died_outcome
from timers.listener.quarantine.parent import Quarantine
from timers.model import run_record
from timers.model.encoding import Record, as_text
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.policy import TaskPolicy
from timers.model.runs import Run
from timers.store.script_rows import GateRun, NewTimer, ParkTimer, Taker
from timers.store.scripts import Scripts

KS = Keyspace()
START_MS = 1_700_000_000_000
LEASE_MS = 1000
KEY_LIMITS = {"k1": 1, "k2": 2}
RATE_NAME, RATE_INTERVAL_MS, RATE_BURST = "task:m.rated", 100, 1
PLAIN, RATED = "m.plain", "m.rated"
GROUPS = (DEFAULT_GROUP, "g2")
CONCURRENCY = 3
LATE_MS = 30
"""How far past its start window a lagging listener's rate run reaches its call."""
"""Runs a virtual listener runs at once (its free slots are offered to handoffs)."""
POLICY = TaskPolicy(max_crashes=3)
"""The policy of the model's tasks: dead after 3 deaths seen in quarantine children
(``quarantine.Quarantine.run``, ``crashes.died_outcome``)."""


def child_checks_fence() -> bool:
    """Whether a quarantine child checks its run's lease right before it starts the task,
    as the listener's own code does it: ``Quarantine`` is given the listener's
    :class:`HeldRuns`, which shares each run's lease with the child (``HeldRuns.share``),
    and the child starts the task only while ``leases.fresh_in`` says it holds. The
    model's child does what this says (with the real ``share`` and ``fresh_in``); its
    checks demand the rule either way."""
    return hasattr(HeldRuns, "share") and "held" in inspect.signature(Quarantine).parameters


def child_asks_gate() -> bool:
    """Whether a suspect run with limits asks its flow gate once its quarantine child has
    loaded the task, right before the start, as the listener's code does it
    (``Quarantine.run``'s ``admit``): a rate's slot is then taken when the run starts, not
    a child's loading time before it. The model's child does what this says; its checks
    demand the rate's interval either way."""
    return "admit" in inspect.signature(Quarantine.run).parameters


@dataclass
class SharedCell:
    """The cell a parent shares a run's lease with its child in (``SharedUntil``: a
    ``multiprocessing.RawValue('d')`` in the listener)."""

    value: float = 0.0


# -- the Redis clock ----------------------------------------------------------------------


class VirtualClock:
    """The Redis clock of the model, in ms; fakeredis reads it through :func:`redis_clock`,
    and its ``INFO`` reports the server's uptime from ``boot_ms`` (the server of the model
    has been up for an hour until a restart sets it). The listeners' monotonic clock is the
    same clock (in seconds)."""

    def __init__(self, ms: int = START_MS) -> None:
        self.ms = ms
        self.boot_ms = ms - 3_600_000

    def info(self) -> bytes:
        """What ``INFO server`` says of this clock's server (the line the scripts read)."""
        return f"# Server\r\nuptime_in_seconds:{(self.ms - self.boot_ms) // 1000}\r\n".encode()

    def time(self) -> float:
        return self.ms / 1000

    def monotonic(self) -> float:
        return self.ms / 1000

    def __getattr__(self, name: str) -> Any:  # sleep …: the real module's
        return getattr(real_time, name)


@contextmanager
def redis_clock(clock: VirtualClock) -> Iterator[None]:
    """fakeredis reads ``clock`` for TIME and for key expiry while this lasts, and answers
    ``INFO`` (which it lacks) with the clock's uptime (:meth:`VirtualClock.info`); the
    listener's lease classes read it as their monotonic clock."""
    modules = (fake_base, fake_server, leases)
    saved = [getattr(module, "time") for module in modules]  # noqa: B009
    for module in modules:
        setattr(module, "time", clock)  # noqa: B010 (a module attribute, not ours)
    SUPPORTED_COMMANDS["info"] = Signature("info", "_model_info", (), (bytes,))  # type: ignore[arg-type]
    FakeSocket._model_info = lambda _socket, *_args: clock.info()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        SUPPORTED_COMMANDS.pop("info", None)
        del FakeSocket._model_info  # type: ignore[attr-defined]
        for module, was in zip(modules, saved, strict=True):
            setattr(module, "time", was)  # noqa: B010


Snapshot = dict[bytes, Any]


def snapshot(server: fakeredis.FakeServer) -> Snapshot:
    """The data of ``server``'s db 0, copied (what a restart may come back with)."""
    return copy.deepcopy(dict(server.dbs[0]._dict))


def restore(server: fakeredis.FakeServer, data: Snapshot) -> None:
    """``server``'s db 0 as it was in ``data``: the writes since are lost."""
    db = server.dbs[0]
    db._dict.clear()  # not db.clear(): it wakes watchers, under a lock only fakeredis holds
    db._expiry_heap.clear()
    for key, item in copy.deepcopy(data).items():
        db[key] = item


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """The result of a coroutine that never suspends (the real :class:`Fence` awaiting the
    model's synchronous scripts)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the coroutine suspended")


class AsyncScripts:
    """The model's synchronous scripts, awaitable as the listener's are (for :class:`Fence`)."""

    def __init__(self, scripts: Scripts) -> None:
        self.scripts = scripts

    async def renew(self, lease_ms: int, tokens: list[str]) -> list[Any]:
        return list(self.scripts.renew(lease_ms, tokens))


# -- what the model expects ---------------------------------------------------------------


@dataclass
class TimerModel:
    """A timer as the producer made it, and what became of it."""

    id: str
    seq: int
    priority: int
    key: str
    rated: bool
    group: str
    due: int
    record: str
    incarnation: int = 0
    """Grows when it is pending anew (scheduled, or a retry written)."""
    status: str = "live"  # live | cancelled | done | dead
    reruns_started: list[int] = field(default_factory=list)
    """The reruns count of each start of this incarnation."""
    ended: int = 0
    """Endings written (not late) for this incarnation: one at most."""
    deaths: int = 0
    """Processes seen to die while running it (a kill of a listener or child in its run)."""
    crash_dead: bool = False
    """Ended dead for crashes (``crashes.died_outcome``)."""
    handed_back: bool = False
    """Pending again after a listener handed back a run of it that had not started (T17):
    it keeps its place in its key's order until it is claimed again."""

    def order(self) -> tuple[int, int, int]:
        """FIFO per key: priority first, then due time, then order of scheduling."""
        return (-self.priority, self.due, self.seq)


@dataclass
class MRun:
    """The model's own record of a run: given when, to whom, its lease as the model reckons
    it, and what became of it (never read from Redis)."""

    token: str
    timer_id: str
    incarnation: int
    listener: str
    lease_until: int
    """Redis clock ms the run's lease holds to (claim, handoff or each renewal + a lease)."""
    reruns: int
    follows: str = ""
    """The token of the run it is next in line after, until that run's ending is written."""
    state: str = "held"
    """held (leased in Redis, lapsed or not) | recovered (a claim took it over: a rerun) |
    ended (its ending written, or handed back) | cut (handed back while its task may have
    been going: its process exited) | dropped (a gate or a takeback dropped it)"""
    holds_slot: bool = False
    started: bool = False
    returned: bool = False
    """Its task returned while the run was held (its work done, the ending on its way)."""
    died: bool = False
    """Its last start died in a quarantine child, which its parent saw: the parent may
    start it again, in a new child, under the same token."""


@dataclass(frozen=True)
class Violation:
    kind: str
    """fenced | key_limit | fifo | rate | early | uncounted | cancelled_ran | lost | stolen
    | revived | ending | twice | older_token | stuck | dead_without_death"""
    text: str


@dataclass
class Executing:
    token: str
    timer_id: str
    key: str
    listener: str
    reruns: int
    source: str


@dataclass
class VListener:
    id: str
    groups: tuple[str, ...]
    held: HeldRuns
    """Tokens the renewals keep, with how long each lease is known to hold (the real class)."""
    keeper: LeaseKeeper
    fence: Fence
    claimed: dict[str, tuple[Run, int]] = field(default_factory=dict)
    """Runs claimed or handed over, not started: token -> (run, clock ms it was read)."""
    nexts: dict[str, Run] = field(default_factory=dict)
    """Runs next in line, waiting for the run they follow to return."""
    children: dict[str, Run] = field(default_factory=dict)
    """Reruns queued for a quarantine child (the parent checked the fence), not started."""
    cells: dict[str, SharedCell] = field(default_factory=dict)
    """The lease each run in quarantine is shared with its child in (``HeldRuns.share``)."""
    child_deaths: dict[str, int] = field(default_factory=dict)
    """Quarantine children that died in each run (``Quarantine.run``'s count)."""
    executing: dict[str, Run] = field(default_factory=dict)
    in_child: set[str] = field(default_factory=set)
    """Tokens of ``executing`` that run in a quarantine child."""
    returned: set[str] = field(default_factory=set)
    """Tokens whose task returned, the ending not written yet (a batch on its way)."""
    holding: set[str] = field(default_factory=set)
    ungated: set[str] = field(default_factory=set)
    """Runs queued for a child whose gate is asked once the child has loaded."""
    doomed: set[str] = field(default_factory=set)
    """Tokens of ``executing`` that end dead: their deaths in quarantine reached the limit."""
    paused: bool = False
    alive: bool = True
    lagging: int = 0
    """Its dispatch is slow: a rate's run its gate lets go reaches its call past its start
    window (``flow_gate.START_WINDOW_S``) on its first try (1), or on its second too (2),
    which it makes once its gate said go again (T29); late on its last, it is handed back
    unstarted (T17)."""
    retried: set[str] = field(default_factory=set)
    """Tokens whose first try came past its start window (their next is their last)."""
    known: KnownKeys = field(default_factory=KnownKeys)
    """The keys its last claims asked for, passed with its next (the real claimer's)."""

    def free_slots(self) -> int:
        return max(CONCURRENCY - len(self.executing) - len(self.claimed), 0)


def record_of(task: str, group: str, priority: int, key: str) -> str:
    opts = ""
    if group != DEFAULT_GROUP:
        opts += f";g={group}"
    if priority:
        opts += f";p={priority}"
    if key:
        opts += f";k={key}"
    return f"{task}{opts}:[]"


def record_options(record: str) -> dict[str, str]:
    return dict(Record.decode(record).options)


def limits_of(record: str) -> tuple[str, int, str, int, int] | None:
    """What the listener asks the gate (``flow/plan.py`` ``plan_of``), or None."""
    task = run_record.record_head(record)[0]
    key = record_options(record).get("k", "")
    limit = KEY_LIMITS.get(key, 1)
    if task != RATED:
        return (key, limit, "", 1, 1) if key else None
    return key, limit, RATE_NAME, RATE_INTERVAL_MS, RATE_BURST


LEFT_ALLOWED = ("|stats", "|seq", "|hist", "|fail", "|rate|", "|near", "|queues")
"""What may be left in Redis once a history is drained: counters, history, failures, a
rate's state (it expires a minute after its tat) and the near horizon; nothing of a
pending, waiting, claimed or running timer."""


# -- the world: Redis, the producer, the listeners, the history ---------------------------


class World:
    endings_survive_default = True
    """Whether the listener's code keeps an ending whose task returned through the death of
    its process before it was written: it does (``timers/listener/endings/journal.py``: each
    process journals a run's ending the moment it finishes, and a listener of the host
    adopts a dead process's journal and writes the endings of the runs still leased;
    :meth:`World.die_unwritten`)."""

    def __init__(self, client: fakeredis.FakeRedis, clock: VirtualClock, fenced: bool,
                 local_fence: bool = False) -> None:
        self.r = client
        self.clock = clock
        self.s = Scripts(client, KS)
        self.fenced = fenced
        self.local_fence = local_fence
        self.child_fence = child_checks_fence()
        self.child_gate = child_asks_gate()
        self.child_delay = False
        """Whether a rerun queued for a quarantine child waits for :meth:`child_start`
        (the model's random runs), or its child starts it at once (the scenarios)."""
        self.endings_survive = self.endings_survive_default
        """Whether an ending whose task returned survives the death of its process before
        it was written (the endings journal; :meth:`die_unwritten`)."""
        self.timers: dict[str, TimerModel] = {}
        self.runs: dict[str, MRun] = {}
        self.listeners: list[VListener] = []
        self.executing: dict[str, Executing] = {}
        self.violations: list[Violation] = []
        self.log: list[str] = []
        self.last_rated_start: int | None = None
        self.spawned = 0

    # -- helpers

    @property
    def now(self) -> int:
        return self.clock.ms

    def note(self, text: str) -> None:
        self.log.append(f"[{self.now - START_MS:>6} ms] {text}")

    def violate(self, kind: str, text: str) -> None:
        self.violations.append(Violation(kind, f"{text} (at {self.now - START_MS} ms)"))
        self.note(f"VIOLATION {kind}: {text}")

    def story(self, before: int = 70, violation: str = "") -> str:
        """The history up to a little after its first violation (or the first one whose
        text has ``violation``; or its end)."""
        first = next((n for n, line in enumerate(self.log) if "VIOLATION" in line
                      and violation in line), len(self.log))
        return "\n".join(self.log[max(first - before, 0):first + 3])

    def spawn(self, groups: tuple[str, ...]) -> VListener:
        self.spawned += 1
        held = HeldRuns(LEASE_MS / 1000)
        keeper = LeaseKeeper(self.r, KS, LEASE_MS / 1000, held)
        listener = VListener(f"L{self.spawned}", groups, held, keeper,
                             Fence(held, AsyncScripts(self.s), LEASE_MS / 1000))  # type: ignore[arg-type]
        self.listeners.append(listener)
        return listener

    def live(self, token: str, margin: int = 0) -> bool:
        """Whether the model holds run ``token`` and reckons its lease holds more than
        ``margin`` ms yet (a run starts only with a tenth of a lease to spare: the time to
        start it and a clock's error cannot take it past its lease)."""
        run = self.runs.get(token)
        return run is not None and run.state == "held" and run.lease_until - margin > self.now

    def release(self, listener: VListener, token: str) -> None:
        """The listener keeps ``token``'s lease no more (``HeldRuns.release``), nor a slot
        of its (``FlowGate.holding``: the lanes drop it with the lease)."""
        listener.held.release([token])
        listener.holding.discard(token)

    # -- the oracle: what the model gives out and what becomes of it

    def given(self, listener: VListener, run: Run, how: str) -> None:
        """Redis gave ``run`` to ``listener`` (a claim, a handoff, a run next in line): judge
        it against the model's own runs, then hold it."""
        timer = self.timers.get(run.timer_id)
        if timer is None:
            self.violate("stolen", f"{how} gave {run.timer_id}, which nobody scheduled")
            return
        mine = [m for m in self.runs.values() if m.timer_id == run.timer_id
                and m.incarnation == timer.incarnation and m.state == "held"]
        if run.source == "recovered":
            if not mine:
                self.violate("twice", f"{how} recovered a run of {run.timer_id} as token "
                             f"{run.token}: the model holds no run of it")
            for old in mine:
                if old.lease_until > self.now:
                    self.violate("stolen", f"{how} recovered {run.timer_id}'s run {old.token} "
                                 f"(of {old.listener}) whose lease holds for "
                                 f"{old.lease_until - self.now} ms yet")
                old.state = "recovered"
                for nxt in self.runs.values():  # its run next in line goes back (T5, cut)
                    if nxt.follows == old.token and nxt.state == "held":
                        nxt.state, nxt.follows = "dropped", ""
            holds = any(old.holds_slot for old in mine)
        else:
            if timer.status != "live":
                self.violate("cancelled_ran" if timer.status == "cancelled" else "twice",
                             f"{how} gave {run.timer_id} ({run.source}), {timer.status} "
                             f"already")
            for old in mine:
                self.violate("twice", f"{how} gave {run.timer_id} ({run.source}) as token "
                             f"{run.token} while its run {old.token} (of {old.listener}) is "
                             f"held")
            holds = run.source == "handoff"
        timer.handed_back = False
        self.runs[run.token] = MRun(run.token, run.timer_id, timer.incarnation, listener.id,
                                    self.now + LEASE_MS, run.reruns, run.follows,
                                    holds_slot=holds)
        listener.held.hold(run.token, run.timer_id)

    def renewed(self, tokens: list[str], lost: set[str]) -> None:
        """A renewal of ``tokens`` found ``lost`` gone: as the model says?"""
        for token in tokens:
            run = self.runs.get(token)
            if run is None:
                continue
            if token in lost and run.state == "held":
                self.violate("stolen", f"a renewal found {run.timer_id}'s run {token} "
                             f"(of {run.listener}) lost; no claim recovered it")
                run.state = "dropped"
            elif token not in lost and run.state != "held":
                self.violate("revived", f"a renewal kept {run.timer_id}'s run {token} "
                             f"({run.state})")
            elif token not in lost:
                run.lease_until = self.now + LEASE_MS

    def dropped(self, token: str, why: str) -> None:
        """A gate held the run back or found it lost: Redis dropped it."""
        run = self.runs.get(token)
        if run is None:
            return
        if why == "lost" and run.state == "held":
            self.violate("stolen", f"a gate found {run.timer_id}'s run {token} lost; no "
                         f"claim recovered it")
        if run.state == "held":
            run.state = "dropped"
        run.holds_slot = False

    def ended_run(self, token: str, late: bool, kind: str) -> bool:
        """A finish of ``token`` (``late`` as Redis says): as the model says? Whether the
        model counts it written."""
        run = self.runs.get(token)
        if run is None:
            return not late
        written = run.state == "held"
        if late and written:
            self.violate("ending", f"{kind} of {run.timer_id}'s run {token} counted late: no "
                         f"claim recovered it (its ending lost)")
        elif not late and not written:
            self.violate("ending", f"{kind} of {run.timer_id}'s run {token} written, though "
                         f"it was {run.state}")
        if written:
            run.state = "ended"
            for nxt in self.runs.values():  # the slot passed on (T14)
                if nxt.follows == token:
                    nxt.follows = ""
                    nxt.holds_slot = nxt.state == "held" and run.holds_slot
        run.holds_slot = False
        return written

    # -- the producer

    def schedule(self, task: str, group: str, priority: int, key: str, in_ms: int) -> str:
        return self.schedule_many([(task, group, priority, key, in_ms)])[0]

    def schedule_many(self, timers: list[tuple[str, str, int, str, int]]) -> list[str]:
        """Schedule ``(task, group, priority, key, in_ms)`` timers in one call (with more
        than one, the script writes the new ones as a batch)."""
        first, new = len(self.timers), []
        for n, (task, group, priority, key, in_ms) in enumerate(timers):
            # ids sort in scheduling order, as generated ones do
            new.append(NewTimer(f"t{first + n:03d}", record_of(task, group, priority, key),
                                "in", in_ms, "n"))
        reply = self.s.schedule(new)
        now = int(reply[0])
        for timer, (task, group, priority, key, in_ms), due in zip(new, timers, reply[1:],
                                                                   strict=True):
            tid = timer.escaped_id
            if due is None or int(due) != now + in_ms:
                self.violate("lost", f"schedule of {tid} in {in_ms} ms answered {due!r}")
            self.timers[tid] = TimerModel(tid, len(self.timers), priority, key, task == RATED,
                                          group, now + in_ms, timer.record)
            self.note(f"schedule {tid} {timer.record} due +{now + in_ms - START_MS}")
        return [timer.escaped_id for timer in new]

    def cancel(self, timer_id: str) -> None:
        timer = self.timers[timer_id]
        claimed = [m.token for m in self.runs.values() if m.timer_id == timer_id
                   and m.incarnation == timer.incarnation and m.state == "held"]
        if self.s.cancel(timer_id) == 1:
            if timer.status != "live" or claimed:
                self.violate("cancelled_ran", f"cancel of {timer_id} returned 1 though it is "
                             f"{timer.status}, claimed as {claimed}")
            timer.status = "cancelled"
            self.note(f"cancel {timer_id}: was pending")
            left = self.traces_of(timer_id)
            if left:
                self.violate("stuck", f"cancel of {timer_id} returned 1 and left it in {left}")

    def traces_of(self, timer_id: str) -> list[str]:
        """Where Redis still has timer ``timer_id`` (its history and failure records aside):
        a record, a due or queue entry, a parked state, a kept slot, a barrier note."""
        found = []
        for key in self.r.keys("*"):
            name, kind = as_text(key), as_text(self.r.type(key))
            if any(part in name for part in ("|hist", "|fail")):
                continue
            if (kind == "zset" and (self.r.zscore(key, timer_id) is not None
                                    or self.r.zscore(key, f"w:{timer_id}") is not None)) \
                    or (kind == "hash" and self.r.hexists(key, timer_id)):
                found.append(name)
        return sorted(found)

    def reschedule(self, timer_id: str, in_ms: int) -> None:
        due = self.s.reschedule(timer_id, "in", in_ms)
        if due is not None:
            self.timers[timer_id].due = int(due)
            self.timers[timer_id].handed_back = False  # its lateness starts afresh
            self.note(f"reschedule {timer_id} due +{int(due) - START_MS}")

    # -- a listener's steps

    def claim(self, listener: VListener, limit: int, horizon_ms: int, events: bool,
              screen: bool = False) -> None:
        event_ids = [t.id for t in reversed(self.timers.values())
                     if events and t.status == "live" and t.due <= self.now]
        reply = self.s.claim(limit=limit, lease_ms=LEASE_MS, horizon_ms=horizon_ms,
                             listener_id=listener.id, event_ids=event_ids,
                             groups=listener.groups, known_keys=tuple(listener.known.keys))
        items = reply[3:]
        runs = [Run.parse(items[i], items[i + 1], items[i + 2])
                for i in range(0, len(items), 3)]
        listener.known.learn(self.s.script("claim").last_asked, KS.timer_key_start, runs,
                             limit)
        for run in runs:
            self.given(listener, run, f"{listener.id}'s claim")
            listener.claimed[run.token] = (run, self.now)
            self.note(f"{listener.id} claims {run.timer_id} token {run.token} "
                      f"({run.source}, reruns {run.reruns}, due +{run.due_ms - START_MS})")
        if screen:
            self.screen(listener)

    def screen(self, listener: VListener) -> None:
        """``FlowGate.screen`` (when the parker wants it): right after the claim, the runs
        whose one limit is a concurrency key (first runs only) ask the gate in one call,
        whatever their due time; those held back are dropped, those let go hold their slot
        and start at their due time without asking again."""
        asked = []
        for run, _ in listener.claimed.values():
            limits = limits_of(run.record_text)
            if not run.reruns and limits is not None and limits[0] and not limits[2] \
                    and run.token not in listener.holding:
                asked.append((run, GateRun(run.token, *limits)))
        if not asked:
            return
        reply = self.s.gate(LEASE_MS, [g for _, g in asked])
        for (run, _), status in zip(asked, reply, strict=True):
            status = as_text(status)
            self.note(f"{listener.id} screens {run.timer_id} token {run.token}: {status}")
            if status == "go":
                listener.holding.add(run.token)
                if not self.runs[run.token].holds_slot:
                    self.check_fifo(run, "screen")
                self.runs[run.token].holds_slot = True
            else:
                del listener.claimed[run.token]
                self.release(listener, run.token)
                self.dropped(run.token, status)

    def park(self, listener: VListener, limit: int) -> None:
        """The parker (``listener/flow/parker.py``): peek a backlog, park the keyed timers."""
        reply = self.s.peek(limit, listener.groups)
        timers = []
        for i in range(0, len(reply), 3):
            record = as_text(reply[i + 2])
            limits = limits_of(record)
            if limits is not None and limits[0] and not limits[2]:
                timers.append(ParkTimer(as_text(reply[i]), record, limits[0], limits[1]))
        if timers:
            parked = self.s.park(LEASE_MS, timers)
            self.note(f"{listener.id} parks {[t.id for t in timers]}: {parked}")

    def start_due(self, listener: VListener) -> None:
        """Start the claimed runs whose due time (as the run says) has come, asking the
        gate for those with limits (one call for them all)."""
        ready = [(run, read) for run, read in listener.claimed.values()
                 if run.due_ms <= self.now]
        asked: list[tuple[Run, GateRun]] = []
        for run, read in ready:
            if listener.claimed.pop(run.token, None) is None:
                continue  # handed back, or started, meanwhile
            if not self._still_ours(listener, run, read):
                continue
            limits = limits_of(run.record_text)
            if limits is None or run.token in listener.holding:  # screened: goes
                self.start(listener, run)
            elif run.source in ("handoff", "next") and limits[0] and not limits[2]:
                listener.holding.add(run.token)
                self.start(listener, run)
            elif self.child_gate and self.suspect(run):  # asks once its child has loaded
                self.start(listener, run)
            else:
                asked.append((run, GateRun(run.token, *limits)))
        if not asked:
            return
        reply = self.s.gate(LEASE_MS, [g for _, g in asked])
        for (run, _), status in zip(asked, reply, strict=True):
            if self.gated(listener, run, as_text(status)) and not self.too_late(listener, run):
                self.start(listener, run)

    def late(self, listener: VListener, run: Run) -> bool:
        """Whether a lagging listener's rate run, let go, reaches its call past its start
        window on this try (a run holding one of several slots of its key has no window)."""
        limits = limits_of(run.record_text)
        if limits is None or not limits[2] or (limits[0] and limits[1] > 1):
            return False
        if listener.lagging < (2 if run.token in listener.retried else 1):
            return False
        self.note(f"{listener.id} too late to start {run.timer_id} token {run.token}")
        return True

    def too_late(self, listener: VListener, run: Run) -> bool:
        """A rate run, let go, that reached its call past its start window (``LATE_MS``
        after its gate said go) asks its gate once more (``executor._call``, T29); past
        its window again, it is handed back unstarted (``OutcomeEndings.unstarted``: its run
        next in line with it). True: it does not start now."""
        if not self.late(listener, run):
            return False
        if run.token in listener.retried:
            self.hand_back(listener, run.token)
            return True
        listener.retried.add(run.token)
        self.clock.ms += LATE_MS
        status = self.s.gate(LEASE_MS, [GateRun(run.token, *limits_of(run.record_text) or ())])
        return not self.gated(listener, run, as_text(status[0])) or self.too_late(listener, run)

    def gated(self, listener: VListener, run: Run, status: str) -> bool:
        """What the gate's ``status`` does to ``run``: True when it goes (holding its key's
        slot, if it has a key), else it is dropped (``flow_gate.admit``)."""
        self.note(f"{listener.id} gate {run.timer_id} token {run.token}: {status}")
        if status == "go":
            limits = limits_of(run.record_text)
            if limits is not None and limits[0]:
                listener.holding.add(run.token)
                if not self.runs[run.token].holds_slot:
                    self.check_fifo(run, "gate")
                self.runs[run.token].holds_slot = True
            return True
        self.release(listener, run.token)
        self.dropped(run.token, status)
        self.not_started(listener, run, status in ("wait", "replaced"))
        return False

    @staticmethod
    def suspect(run: Run) -> bool:
        """A run the listener sends to a quarantine child (``executor._call``)."""
        return bool(run.reruns) and run.source != "next"

    def not_started(self, listener: VListener, run: Run, taken_back: bool) -> None:
        """``executor.py`` (``Turns.not_started``): a run next in line after a run its gate
        held back does not start; it writes no ending when the gate took it back into its
        key's queue (``gate.lua`` ``take_back_next``), else (a lost lease) it is handed
        back."""
        for following in [n for n in listener.nexts.values() if n.follows == run.token]:
            if not taken_back:
                self.hand_back(listener, following.token)
                continue
            del listener.nexts[following.token]
            self.release(listener, following.token)
            self.dropped(following.token, "taken back")
            self.note(f"{listener.id} drops next {following.timer_id} token "
                      f"{following.token}: taken back with {run.timer_id}")

    def must_ask(self, listener: VListener, token: str, read_at: int) -> bool:
        """Whether the listener asks Redis (renews) before it starts run ``token`` whose
        reply it read at ``read_at``: the fenced listener always; today's when its real
        fence says the lease is not fresh; the one before the fence when the reply was read
        more than half a lease late."""
        if self.fenced:
            return True
        if self.local_fence:
            return not listener.fence.fresh(token)
        return self.now - read_at > LEASE_MS // 2

    def ask(self, listener: VListener, run: Run) -> bool:
        """Ask Redis whether ``run`` is still ``listener``'s (renewed if so): the real
        ``Fence.revalidate``."""
        kept = bool(run_now(listener.fence.revalidate(run)))
        self.renewed([run.token], set() if kept else {run.token})
        if not kept:
            self.release(listener, run.token)
        return kept

    def _still_ours(self, listener: VListener, run: Run, read_at: int) -> bool:
        """Today's listener renews a run first when its fence says so; the fenced one
        always does."""
        if self.must_ask(listener, run.token, read_at) and not self.ask(listener, run):
            self.note(f"{listener.id} drops {run.timer_id} token {run.token}: lease lost")
            return False
        return True

    def start(self, listener: VListener, run: Run) -> None:
        """The listener starts ``run``: a rerun (a lapse of its lease: a suspect, never a
        crash) goes to a quarantine child (the parent checked the fence), with its lease
        shared (``HeldRuns.share``)."""
        if self.suspect(run):
            self.to_child(listener, run)
            return
        self.began(listener, run)

    def to_child(self, listener: VListener, run: Run, after_death: bool = False) -> None:
        """``Quarantine.run``: a new child for ``run``, the run's lease shared with it."""
        cell = listener.cells.setdefault(run.token, SharedCell())
        listener.held.share(run.token, cell)
        listener.children[run.token] = run
        limits = limits_of(run.record_text)
        if (self.child_gate and not after_death and limits is not None
                and (run.token not in listener.holding or limits[2])):
            listener.ungated.add(run.token)  # its gate is asked once the child has loaded
            # (once per child a run is queued for: a new child after a death starts on the
            # slot the first one took; one after a stale start asks its rate again)
        self.note(f"{listener.id} queues {run.timer_id} token {run.token} for a child")
        if not self.child_delay:
            self.child_start(listener, run.token)

    def child_start(self, listener: VListener, token: str) -> None:
        """A quarantine child of ``listener`` has loaded the rerun queued for it. A run with
        limits asks its gate now (:func:`child_asks_gate`; the parent asks, so a paused
        parent keeps the child waiting). When the listener's code has the child check the
        fence (:func:`child_checks_fence`), it starts the task only while the shared lease
        holds (``leases.fresh_in``), else it says ``stale`` and its parent revalidates the
        run (``checks.Quarantined``): a run still held goes to a new child, one lost is
        dropped. A parent that is paused reads ``stale`` when it goes on (the run waits for
        a new child)."""
        run = listener.children.pop(token)
        if token in listener.ungated:
            if listener.paused:
                listener.children[token] = run
                return
            listener.ungated.discard(token)
            if not self.gated(listener, run, as_text(self.s.gate(
                    LEASE_MS, [GateRun(run.token, *limits_of(run.record_text) or ())])[0])):
                listener.cells.pop(token, None)
                return
            if self.late(listener, run):  # the child read the word past its window: a
                if run.token in listener.retried:  # new child asks the gate once more (T29)
                    self.hand_back(listener, run.token)
                else:
                    listener.retried.add(run.token)
                    self.to_child(listener, run)
                return
        cell = listener.cells.get(token)
        if cell is None:  # (released meanwhile: its run is no longer the listener's)
            return
        if self.child_fence and not fresh_in(cell, listener.held.margin):
            self.note(f"{listener.id}'s child finds {run.timer_id} token {token} stale")
            if listener.paused:
                listener.children[token] = run
                return
            if not self.ask(listener, run):
                listener.cells.pop(token, None)
                self.note(f"{listener.id} drops {run.timer_id} token {token}: lease lost")
                return
            self.to_child(listener, run)
            return
        listener.in_child.add(token)
        self.began(listener, run, "in a child")

    def began(self, listener: VListener, run: Run, where: str = "") -> None:
        """The task's code starts now: check every rule a start keeps."""
        timer = self.timers[run.timer_id]
        mine = self.runs[run.token]
        what = f"{listener.id} starts {run.timer_id} token {run.token} ({run.source}, " \
               f"reruns {run.reruns}{', ' + where if where else ''})"
        self.note(what)
        if not self.live(run.token, LEASE_MS // 10):
            self.violate("fenced", f"{what} without its lease held for a tenth of a lease "
                         f"yet ({mine.state}, lease {mine.lease_until - self.now:+} ms)")
        if timer.status == "cancelled":
            self.violate("cancelled_ran", f"{what} after cancel returned 1")
        if self.now < timer.due:
            self.violate("early", f"{what} {timer.due - self.now} ms before its due time")
        again = mine.started and mine.died  # its parent saw its last child die in it
        if mine.started and not mine.died:
            self.violate("twice", f"{what}: started before under this token, and that start "
                         f"did not die")
        mine.died = False
        if timer.reruns_started and run.reruns <= max(timer.reruns_started) and not again:
            self.violate("uncounted", f"{what}: started before with reruns "
                         f"{timer.reruns_started}, this start is not counted as a rerun")
        before = [m for m in self.runs.values() if m.timer_id == run.timer_id and m.started
                  and m.token != run.token]
        newer = [m.token for m in before if int(m.token) > int(run.token)]
        if newer:
            self.violate("older_token", f"{what} after its newer run(s) {newer} started")
        uncut = [m.token for m in before if m.incarnation == mine.incarnation
                 and (m.state not in ("recovered", "cut") or m.returned)]
        if uncut:
            self.violate("twice", f"{what}: its run(s) {uncut} of the same schedule started "
                         f"and were not cut off (or had returned)")
        mine.started = True
        timer.reruns_started.append(run.reruns)
        if timer.key:
            # a run the model knows was taken over (recovered) is a paused process going on
            # with the run it was in: invariant 1's one exception (design invariant 12), a
            # late finish; a killed process's run is gone
            running = {e.timer_id for e in self.executing.values() if e.key == timer.key
                       and self.runs[e.token].state == "held"}
            running.add(timer.id)
            if len(running) > KEY_LIMITS[timer.key]:
                self.violate("key_limit", f"{what}: key {timer.key} (limit "
                             f"{KEY_LIMITS[timer.key]}) runs {sorted(running)} at once")
        if timer.rated:
            if (self.last_rated_start is not None
                    and self.now - self.last_rated_start < RATE_INTERVAL_MS):
                # one exception, noted apart: a rerun started again in a new quarantine
                # child after its child died starts on the rate slot its first start took
                # (held back for the rate, it would lose the deaths counted so far)
                self.violate("rate_after_death" if again else "rate",
                             f"{what}: {self.now - self.last_rated_start} ms after "
                             f"the last start of rate {RATE_NAME} (interval {RATE_INTERVAL_MS})")
            if not again:  # (the starts that took a slot of the rate keep its pace)
                self.last_rated_start = self.now
        self.executing[run.token] = Executing(run.token, timer.id, timer.key, listener.id,
                                              run.reruns, run.source)
        listener.executing[run.token] = run

    def check_fifo(self, run: Run, how: str) -> None:
        """A run of a key got its slot: no timer of that key that goes before it (priority,
        due, scheduling order), due, claimed (a run the model holds, by a live lease or by
        one that lapsed and that no claim recovered yet: its listener may renew it and go
        on) or waiting in a flow queue, is left waiting."""
        timer = self.timers[run.timer_id]
        if not timer.key or timer.reruns_started:
            return  # a rerun (its run cut off) goes first: its place is its first run's
        waiting_runs: dict[str, str] = {}
        for other_run in self.runs.values():
            if (other_run.state == "held" and not other_run.started
                    and other_run.token != run.token and not other_run.holds_slot
                    and not other_run.follows
                    and not any(other_run.token in li.holding for li in self.listeners)):
                lapsed = "" if other_run.lease_until > self.now else " (lapsed)"
                waiting_runs[other_run.timer_id] = f"claimed as token {other_run.token}{lapsed}"
        parked = {as_text(k): as_text(v) for k, v in self.r.hgetall(KS.parked).items()}
        for other in self.timers.values():
            if (other.id == timer.id or other.key != timer.key or other.status != "live"
                    or other.due > self.now or other.order() >= timer.order()
                    or any(e.timer_id == other.id for e in self.executing.values())):
                continue
            state = parked.get(other.id, "")
            where = waiting_runs.get(other.id) or (  # "C": promoted, a slot kept for it
                f"waiting in a flow queue ({state})" if state and state[0] != "C" else "") or (
                "pending again, handed back unstarted" if other.handed_back
                and not any(m.timer_id == other.id and m.state == "held"
                            for m in self.runs.values()) else "")
            if where:
                self.violate("fifo", f"{run.timer_id} (order {timer.order()}) got key "
                             f"{timer.key}'s slot by {how} while {other.id} (order "
                             f"{other.order()}) ahead of it is {where}")

    def returns(self, listener: VListener, token: str) -> None:
        """The task of run ``token`` returns: a run next in line after it starts now, in
        its thread, before this ending is written (runner.py); the ending is on its way."""
        listener.returned.add(token)
        self.executing.pop(token, None)  # its task runs no more
        mine = self.runs.get(token)
        if mine is not None and mine.state == "held":
            mine.returned = True
        for following in [n for n in listener.nexts.values() if n.follows == token]:
            del listener.nexts[following.token]
            if (limits_of(following.record_text) or ("", 0, ""))[2]:
                # a rate to ask about: it waits for the run before it to end, then asks
                # the gate (checks.py ``FollowTurn``)
                listener.claimed[following.token] = (following, self.now)
                continue
            if (self.fenced or self.local_fence) \
                    and self.must_ask(listener, following.token, self.now) \
                    and not self.ask(listener, following):
                self.note(f"{listener.id} drops next {following.timer_id}: lease lost")
                continue
            listener.holding.add(following.token)
            self.began(listener, following)

    def finish(self, listener: VListener, token: str, kind: str, delay_ms: int,
               gate: bool = True, hand: bool = True) -> None:
        """End run ``token``; the runs handed along start (or ask their gate) at once,
        or, without ``gate``, at the listener's next ``start_due`` (it stalled between
        reading the reply and gating them); without ``hand``, none is handed (an ending
        written from a dead process's journal). A run whose deaths in quarantine reached
        its limit ends dead, whatever ``kind`` says."""
        crashed = token in listener.doomed
        listener.doomed.discard(token)
        if crashed:
            kind = "dead"
        if token not in listener.returned:
            self.returns(listener, token)
        listener.returned.discard(token)
        listener.in_child.discard(token)
        listener.cells.pop(token, None)
        listener.child_deaths.pop(token, None)
        run = listener.executing.pop(token)
        self.executing.pop(token, None)
        timer = self.timers[run.timer_id]
        if kind == "ok":
            ending = (token, "ok", "", "")
        elif kind == "dead":
            ending = (token, "fail", f"{run.escaped_id}:{token}", "{}")
        else:
            options = record_options(run.record_text)
            options.pop("w", None)
            options.pop("rc", None)
            options["a"] = str(int(options.get("a", "0")) + 1)
            task = run_record.record_head(run.record_text)[0]
            retry = task + "".join(f";{k}={v}" for k, v in options.items()) + ":[]"
            ending = (token, "retry", f"{run.escaped_id}:{retry}", str(delay_ms))
        freeing = token in listener.holding
        listener.holding.discard(token)
        take = min(1, listener.free_slots()) if freeing and hand else 0
        taker = Taker(listener.id, listener.groups, take, LEASE_MS, freeing)
        reply = self.s.finish(retention_ms=60_000, endings=[ending], taker=taker)
        self.release(listener, token)
        late = int(reply[0] or 0)
        self.note(f"{listener.id} finishes {run.timer_id} token {token}: {kind}"
                  f"{' (late)' if late else ''}")
        if self.ended_run(token, bool(late), "the finish"):
            self._ended(timer, kind, ending, delay_ms, crashed)
        items = reply[1:]
        nexts = []
        for i in range(0, len(items), 3):
            handed = Run.parse(*items[i:i + 3])
            self.given(listener, handed, f"{listener.id}'s finish")
            self.note(f"{listener.id} is handed {handed.timer_id} token {handed.token} "
                      f"({handed.source}{' after ' + handed.follows if handed.follows else ''})")
            if handed.source == "next":
                listener.nexts[handed.token] = handed
                nexts.append(handed)
            else:
                if not (limits_of(handed.record_text) or ("", 0, "x"))[2]:
                    self.check_fifo(handed, "handoff")
                listener.claimed[handed.token] = (handed, self.now)
        if gate:
            self.start_due(listener)
        for handed in nexts:  # its slot is promised from now (the run before it started)
            if handed.token in listener.nexts:  # not taken back with a run held at its gate
                self.check_fifo(handed, "next in line")

    def end_before_gate(self, listener: VListener, token: str, kind: str) -> None:
        """The executor ends a claimed run, come due, before its gate (T28): ``dead`` (it
        missed its max lateness, its task was refused), or ``ok`` when an earlier run of
        the same schedule returned (a rerun ended the same way as that run, from the
        journal of its process: ``Lane.start``). Its task does not run; a run next in
        line after it goes on as after any ending (``returns``)."""
        run, _ = listener.claimed[token]
        timer = self.timers[run.timer_id]
        if run.due_ms > self.now or (kind == "ok" and not any(
                m.timer_id == run.timer_id and m.incarnation == timer.incarnation
                and m.returned and m.token != token for m in self.runs.values())):
            return
        del listener.claimed[token]
        listener.executing[token] = run
        self.note(f"{listener.id} ends {run.timer_id} token {token} before its gate: {kind}")
        self.finish(listener, token, kind, 0)

    def _ended(self, timer: TimerModel, kind: str, ending: tuple[str, str, str, str],
               delay_ms: int, crashed: bool) -> None:
        timer.ended += 1
        if timer.ended > 1:
            self.violate("twice", f"{timer.id}: a second ending written for one schedule")
        if kind == "ok":
            timer.status = "done"
        elif kind == "dead":
            timer.status = "dead"
            timer.crash_dead = crashed
            if crashed and timer.deaths < POLICY.max_crashes:
                self.violate("dead_without_death", f"{timer.id} ended dead for crashes after "
                             f"{timer.deaths} death(s) of a process running it (limit "
                             f"{POLICY.max_crashes})")
        else:  # the retry is pending again (the model's ids are never scheduled twice)
            timer.record = ending[2].partition(":")[2]
            timer.due = self.now + delay_ms
            pended = self.r.zscore(KS.due_index_of(timer.record), timer.id)
            if pended != timer.due:
                self.violate("early", f"{timer.id}'s retry pended at {pended!r}, not at its "
                             f"due time {timer.due} (+{delay_ms} ms)")
            timer.incarnation += 1
            timer.ended = 0
            timer.reruns_started = []

    def hand_back(self, listener: VListener, token: str, cut: bool = False) -> None:
        """A listener stopping (or out of memory) hands back a run it has not started; with
        ``cut``, one that may have started: its task still going past the shutdown timeout
        in a process about to exit (``Lane.drain``: a grace, and its next start a rerun)."""
        listener.claimed.pop(token, None)
        nxt = listener.nexts.pop(token, None)
        listener.children.pop(token, None)
        listener.cells.pop(token, None)
        listener.executing.pop(token, None)
        listener.in_child.discard(token)
        listener.holding.discard(token)
        self.executing.pop(token, None)
        self.release(listener, token)
        mine = self.runs.get(token)
        if mine is not None and mine.state == "held" and mine.holds_slot \
                and self.timers[mine.timer_id].incarnation == mine.incarnation:
            # its slot is kept for its timer; its run next in line goes back into the key's
            # queue (T22), and its listener does not start it
            for following in self.runs.values():
                if following.follows == token and following.state == "held":
                    following.state, following.follows = "dropped", ""
                    listener.nexts.pop(following.token, None)
                    self.release(listener, following.token)
        grace = str(HAND_BACK_GRACE_MS) if cut else ""
        reply = self.s.finish(retention_ms=60_000,
                              endings=[(token, "release", grace, nxt.follows if nxt else "")])
        if self.ended_run(token, bool(int(reply[0] or 0)), "the hand-back") and mine:
            if cut:  # started: its place is its first start's, as a killed run's is
                mine.state = "cut"
            else:
                self.timers[mine.timer_id].handed_back = True
        self.note(f"{listener.id} {'cuts' if cut else 'hands back'} token {token}")

    def stop(self, listener: VListener) -> None:
        """SIGTERM: the listener hands back the runs it has not started, writes the endings
        of the runs whose task returned, hands back (cut) the runs still going past its
        shutdown timeout, and exits: their tasks with it (``Lane.drain``)."""
        for token in sorted([*listener.claimed, *listener.nexts], key=int):
            if token in listener.claimed or token in listener.nexts:
                self.hand_back(listener, token)
        for token in sorted([*listener.executing, *listener.children], key=int):
            if token in listener.returned:
                self.finish(listener, token, "ok", 0, gate=False, hand=False)
            elif token in listener.executing or token in listener.children:
                self.hand_back(listener, token, cut=True)
        listener.alive = False
        self.note(f"{listener.id} stopped")

    def kill(self, listener: VListener) -> None:
        """``kill -9`` of a listener: every run it was in died with it (seen: a death of a
        process running it; not for a run whose task had returned)."""
        listener.alive = False
        for token, run in listener.executing.items():
            self.executing.pop(token, None)
            if token not in listener.returned and token not in listener.doomed:
                self.timers[run.timer_id].deaths += 1
        self.note(f"{listener.id} killed")

    def die_unwritten(self, listener: VListener) -> None:
        """The tasks of every run ``listener`` is in return, and the process dies before
        their endings are written (a batch on its way, a poison in another thread): a
        finished run must not run again (design invariant 8). With :attr:`endings_survive`
        (the endings journal) a listener of the host adopts the dead process's journal at
        once (a listener adopts at its start, and the model starts one as this one dies)
        and writes the endings of the runs still leased through its own ``finish.lua``
        (its writer is handed no run for them); a run recovered meanwhile gets nothing
        (a late finish writes nothing either). Without it, they are lost."""
        for token in sorted(listener.executing, key=int):
            if token in listener.executing and token not in listener.returned:
                self.returns(listener, token)
        returned = [t for t in listener.returned if t in listener.executing]
        self.note(f"{listener.id} dies with the endings of {sorted(returned)} unwritten")
        if self.endings_survive:
            for token in sorted(returned, key=int):
                self.finish(listener, token, "ok", 0, gate=False, hand=False)
        self.kill(listener)

    def kill_child(self, listener: VListener, token: str) -> None:
        """A quarantine child dies in its run (a poison): a death its parent sees
        (``Quarantine.run``). The parent keeps the lease and runs the rerun again in a new
        child, until the deaths of this run's children reach the task's ``max_crashes``;
        then it ends dead (``crashes.died_outcome``: a ``crashed`` outcome, never
        retried)."""
        run = listener.executing[token]
        listener.in_child.discard(token)
        listener.returned.discard(token)
        self.executing.pop(token, None)
        self.timers[run.timer_id].deaths += 1
        died = listener.child_deaths[token] = listener.child_deaths.get(token, 0) + 1
        self.note(f"{listener.id}'s child running {run.timer_id} token {token} died ({died} "
                  f"of {POLICY.max_crashes})")
        if died >= POLICY.max_crashes:
            outcome = died_outcome(died, f"killed by SIGKILL in a quarantine process on "
                                   f"{listener.id}", run.reruns)
            assert outcome.kind == "crashed", outcome  # a failure for good, not a retry
            listener.doomed.add(token)
            self.finish(listener, token, "dead", 0, gate=not listener.paused)
            return
        del listener.executing[token]
        mine = self.runs.get(token)
        if mine is not None:
            mine.died = True
        self.to_child(listener, run, after_death=True)

    # -- whole-world checks

    def check_nothing_lost(self) -> None:
        """Every timer the model holds live is pending or claimed in Redis, and each is in
        one place: never both in a due index and in a key's or a rate's queue, never both
        claimed and pending."""
        runs = {run_record.decode(as_text(v))[3] for v in self.r.hvals(KS.running_records)}
        pending = {as_text(k) for k in self.r.hkeys(KS.records)}
        due, queued = set(), set()
        for key in self.r.keys("*"):
            name = as_text(key)
            if "|due" in name or "|waitk|" in name or "|waitr|" in name:
                members = {as_text(m) for m in self.r.zrange(key, 0, -1)}
                (queued if "|wait" in name else due).update(members)
        for timer_id in sorted((due & queued) | (runs & pending)):
            self.violate("twice", f"{timer_id} is in two places at once: "
                         f"{self.traces_of(timer_id)}, claimed: {timer_id in runs}")
        for timer in self.timers.values():
            if timer.status == "live" and timer.id not in runs and timer.id not in pending:
                self.violate("lost", f"{timer.id} is neither pending nor claimed nor done")

    def drain(self, max_ms: int = 60_000) -> None:
        """End the history: every listener resumes and keeps up (a dispatch slow for good
        would start no rate run); time goes on 100 ms at a time (leases
        renewed), each living listener claims, starts and lets every run end ok, until
        every timer ended as the model says. Then nothing of a timer may be left in Redis:
        no record, due entry, run, slot, queue entry, barrier or note (liveness)."""
        for listener in self.listeners:
            listener.paused, listener.lagging = False, 0
        self.note("drain")
        deadline = self.now + max_ms
        while self.now < deadline and not self.settled():
            for listener in [li for li in self.listeners if li.alive]:
                lost = self.renew_all(listener)
                for token in lost:
                    listener.claimed.pop(token, None)
                    listener.nexts.pop(token, None)
                    listener.children.pop(token, None)
            self.clock.ms += 100
            for listener in [li for li in self.listeners if li.alive]:
                self.claim(listener, 10, 0, False)
                self.start_due(listener)
                for token in list(listener.children):
                    self.child_start(listener, token)
                for token in sorted(listener.executing, key=int):
                    if token in listener.executing:
                        self.finish(listener, token, "ok", 0)
        for timer in self.timers.values():
            if timer.status == "live":
                self.violate("stuck", f"{timer.id} ({timer.record}) never ended: drained for "
                             f"{max_ms} ms")
            if timer.status in ("done", "dead") and timer.ended != 1:
                self.violate("twice", f"{timer.id}: {timer.ended} endings written")
        left = {}
        for key in self.r.keys("*"):
            name = as_text(key)
            if any(part in name for part in LEFT_ALLOWED):
                continue
            kind = as_text(self.r.type(key))
            size = {"hash": self.r.hlen, "zset": self.r.zcard, "set": self.r.scard}.get(
                kind, lambda _k: 1)(key)
            if size:
                left[name] = size
        if left:
            self.violate("stuck", f"drained, Redis still holds {left}")

    def settled(self) -> bool:
        return all(t.status != "live" for t in self.timers.values()) and not any(
            li.claimed or li.nexts or li.executing or li.children
            for li in self.listeners if li.alive)

    def renew_all(self, listener: VListener) -> set[str]:
        """The listener's renewal thread, once (``LeaseKeeper.renew_once``): the tokens it
        found lost."""
        tokens = listener.held.tokens()
        before = set(tokens)
        listener.keeper.renew_once()
        lost = before - set(listener.held.tokens())
        self.renewed(tokens, lost)
        return lost
