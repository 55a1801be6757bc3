"""A model of timers' flow control for ``test_model_flow.py``: the real Lua scripts on
fakeredis, driven through :class:`timers.store.scripts.Scripts` by virtual listeners that do
with each reply what ``timers/listener/*`` does, on a virtual Redis clock; and a history
of every start, checked against the invariants of ``docs/state-machine.md``.

The Redis clock. The scripts read time with ``redis.call('TIME')`` and fakeredis answers
that (and expires keys) from ``time.time()``, read in two of its modules. :func:`redis_clock`
swaps the ``time`` name of those two modules for a shim whose ``time()`` is a
:class:`VirtualClock`: the scripts run unchanged, no test sleeps, and a lease lapses when
the model moves the clock on. Only fakeredis's view of time changes (the test process's own
``time`` module is untouched).

A virtual listener mirrors the real one:

- claim (``claimer.py``): the runs of the reply are kept; one read late (more than half a
  lease after it was sent: here, after the listener was paused) is renewed first
  (``leases.still_held``) and only those still held are kept;
- start (``executor.py``): waits until the run's ``due_ms``; a run with a concurrency key
  or a rate limit asks ``gate.lua`` (``flow_gate.admit``) unless it was handed over holding
  its key's slot with no rate limit; "go" starts it, anything else drops it (no ending);
- finish (``endings.py`` / ``handoff.py``): the ending goes with a taker of one run per
  key slot it frees (``follow`` on); the handed runs start (a handed one read late is
  renewed first), a run next in line waits for the run before it;
- a run next in line (``turns.py`` / ``runner.py``): starts the moment the run before it
  returns, in the same thread, before that run's ending is written;
- renewals (``leases.py``): a token found lost is no longer renewed, nothing else.

With ``fenced`` the listener is the one the design asks for (invariant 12): it starts any
run only after a renewal finds its lease still held. With ``local_fence`` it is the one in
``timers/listener`` (``leases.py`` ``HeldRuns``, ``Fence``): it knows how long each lease
holds (half a lease from the reply that gave it the run, a lease from each renewal that kept
it) and asks Redis first only when that is a tenth of a lease away or less (after a pause).
With neither, it is the listener before the fence (it renews first only a claim read more
than half a lease late).
"""

from __future__ import annotations

import copy
import time as real_time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import fakeredis._socket._base as fake_base
import fakeredis.commands_mixins.server_mixin as fake_server
from fakeredis._commands import SUPPORTED_COMMANDS, Signature
from fakeredis._socket._fakesocket import FakeSocket

from timers.model import run_record
from timers.model.encoding import Record, as_text
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.runs import Run
from timers.store.scripts import GateRun, NewTimer, ParkTimer, Scripts, Taker

KS = Keyspace()
START_MS = 1_700_000_000_000
LEASE_MS = 1000
KEY_LIMITS = {"k1": 1, "k2": 2}
RATE_NAME, RATE_INTERVAL_MS, RATE_BURST = "task:m.rated", 100, 1
PLAIN, RATED = "m.plain", "m.rated"
GROUPS = (DEFAULT_GROUP, "g2")
CONCURRENCY = 3
"""Runs a virtual listener runs at once (its free slots are offered to handoffs)."""

# -- the Redis clock ----------------------------------------------------------------------


class VirtualClock:
    """The Redis clock of the model, in ms; fakeredis reads it through :func:`redis_clock`,
    and its ``INFO`` reports the server's uptime from ``boot_ms`` (the server of the model
    has been up for an hour until a restart sets it)."""

    def __init__(self, ms: int = START_MS) -> None:
        self.ms = ms
        self.boot_ms = ms - 3_600_000

    def info(self) -> bytes:
        """What ``INFO server`` says of this clock's server (the line the scripts read)."""
        return f"# Server\r\nuptime_in_seconds:{(self.ms - self.boot_ms) // 1000}\r\n".encode()

    def time(self) -> float:
        return self.ms / 1000

    def __getattr__(self, name: str) -> Any:  # sleep, monotonic …: the real module's
        return getattr(real_time, name)


@contextmanager
def redis_clock(clock: VirtualClock) -> Iterator[None]:
    """fakeredis reads ``clock`` for TIME and for key expiry while this lasts, and answers
    ``INFO`` (which it lacks) with the clock's uptime (:meth:`VirtualClock.info`)."""
    modules = (fake_base, fake_server)
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

    def order(self) -> tuple[int, int, int]:
        """FIFO per key: priority first, then due time, then order of scheduling."""
        return (-self.priority, self.due, self.seq)


@dataclass(frozen=True)
class Violation:
    kind: str
    """fenced | key_limit | fifo | rate | early | uncounted | cancelled_ran | lost"""
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
    claimed: dict[str, tuple[Run, int]] = field(default_factory=dict)
    """Runs claimed or handed over, not started: token -> (run, clock ms it was read)."""
    nexts: dict[str, Run] = field(default_factory=dict)
    """Runs next in line, waiting for the run they follow to return."""
    executing: dict[str, Run] = field(default_factory=dict)
    holding: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    """Tokens the renewals keep."""
    held_until: dict[str, int] = field(default_factory=dict)
    """Token -> Redis clock ms until which this listener knows its lease holds (the fence)."""
    paused: bool = False
    alive: bool = True

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
    """What the listener asks the gate (``flow_gate.flow_limits``), or None."""
    task = run_record.record_head(record)[0]
    key = record_options(record).get("k", "")
    limit = KEY_LIMITS.get(key, 1)
    if task != RATED:
        return (key, limit, "", 1, 1) if key else None
    return key, limit, RATE_NAME, RATE_INTERVAL_MS, RATE_BURST


# -- the world: Redis, the producer, the listeners, the history ---------------------------


class World:
    def __init__(self, client: fakeredis.FakeRedis, clock: VirtualClock, fenced: bool,
                 local_fence: bool = False) -> None:
        self.r = client
        self.clock = clock
        self.s = Scripts(client, KS)
        self.fenced = fenced
        self.local_fence = local_fence
        self.timers: dict[str, TimerModel] = {}
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

    def spawn(self, groups: tuple[str, ...]) -> VListener:
        self.spawned += 1
        listener = VListener(f"L{self.spawned}", groups)
        self.listeners.append(listener)
        return listener

    def lease_held(self, run: Run) -> bool:
        score = self.lease_until(run)
        return score is not None and score > self.now

    def lease_until(self, run: Run) -> float | None:
        """The lease deadline of ``run`` in Redis (past when it lapsed), or None when its
        token is gone from its running set (ended, handed back, recovered)."""
        group = record_options(run.record_text).get("g", DEFAULT_GROUP)
        score = self.r.zscore(KS.running_of(group), run.token)
        return None if score is None else float(score)

    def renew(self, listener: VListener, tokens: list[str]) -> set[str]:
        """Renew ``tokens``; the lost ones (no longer renewed)."""
        if not tokens:
            return set()
        lost = {as_text(t) for t in self.s.renew(LEASE_MS, tokens)}
        listener.held -= lost
        for token in tokens:
            if token not in lost:
                listener.held_until[token] = self.now + LEASE_MS
        return lost

    def must_ask(self, listener: VListener, token: str, read_at: int) -> bool:
        """Whether the listener asks Redis (renews) before it starts run ``token`` whose
        reply it read at ``read_at``."""
        if self.fenced:
            return True
        if self.local_fence:
            return listener.held_until.get(token, 0) - self.now <= LEASE_MS // 10
        return self.now - read_at > LEASE_MS // 2

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
        for timer, (task, group, priority, key, _), due in zip(new, timers, reply[1:],
                                                               strict=True):
            tid = timer.escaped_id
            self.timers[tid] = TimerModel(tid, len(self.timers), priority, key, task == RATED,
                                          group, int(due), timer.record)
            self.note(f"schedule {tid} {timer.record} due +{int(due) - START_MS}")
        return [timer.escaped_id for timer in new]

    def cancel(self, timer_id: str) -> None:
        if self.s.cancel(timer_id) == 1:
            self.timers[timer_id].status = "cancelled"
            self.note(f"cancel {timer_id}: was pending")

    def reschedule(self, timer_id: str, in_ms: int) -> None:
        due = self.s.reschedule(timer_id, "in", in_ms)
        if due is not None:
            self.timers[timer_id].due = int(due)
            self.note(f"reschedule {timer_id} due +{int(due) - START_MS}")

    # -- a listener's steps

    def claim(self, listener: VListener, limit: int, horizon_ms: int, events: bool,
              screen: bool = False) -> None:
        event_ids = [t.id for t in reversed(self.timers.values())
                     if events and t.status == "live" and t.due <= self.now]
        reply = self.s.claim(limit=limit, lease_ms=LEASE_MS, horizon_ms=horizon_ms,
                             listener_id=listener.id, event_ids=event_ids,
                             groups=listener.groups)
        items = reply[3:]
        for i in range(0, len(items), 3):
            run = Run.parse(items[i], items[i + 1], items[i + 2])
            listener.claimed[run.token] = (run, self.now)
            listener.held.add(run.token)
            listener.held_until[run.token] = self.now + LEASE_MS // 2
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
        inherited = self.inherited_slots([g for _, g in asked])
        reply = self.s.gate(LEASE_MS, [g for _, g in asked])
        for (run, _), status in zip(asked, reply, strict=True):
            status = as_text(status)
            self.note(f"{listener.id} screens {run.timer_id} token {run.token}: {status}")
            if status == "go":
                listener.holding.add(run.token)
                if run.token not in inherited:
                    self.check_fifo(run, "screen")
            else:
                del listener.claimed[run.token]
                listener.held.discard(run.token)

    def park(self, listener: VListener, limit: int) -> None:
        """The parker (``listener/parker.py``): peek a backlog, park the keyed timers."""
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
            del listener.claimed[run.token]
            if not self._still_ours(listener, run, read):
                continue
            limits = limits_of(run.record_text)
            if limits is None or run.token in listener.holding:  # screened: goes
                self.start(listener, run)
            elif run.source in ("handoff", "next") and limits[0] and not limits[2]:
                listener.holding.add(run.token)
                self.start(listener, run)
            else:
                asked.append((run, GateRun(run.token, *limits)))
        if not asked:
            return
        inherited = self.inherited_slots([g for _, g in asked])
        reply = self.s.gate(LEASE_MS, [g for _, g in asked])
        for (run, spec), status in zip(asked, reply, strict=True):
            status = as_text(status)
            self.note(f"{listener.id} gate {run.timer_id} token {run.token}: {status}")
            if status == "go":
                if spec.key:
                    listener.holding.add(run.token)
                    if run.token not in inherited:
                        self.check_fifo(run, "gate")
                self.start(listener, run)
            else:
                listener.held.discard(run.token)
                self.not_started(listener, run, status in ("wait", "replaced"))

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
            listener.held.discard(following.token)
            self.note(f"{listener.id} drops next {following.timer_id} token "
                      f"{following.token}: taken back with {run.timer_id}")

    def _still_ours(self, listener: VListener, run: Run, read_at: int) -> bool:
        """Today's listener renews a run first when its reply was read late (a pause since);
        the fenced one always does."""
        if self.must_ask(listener, run.token, read_at) \
                and run.token in self.renew(listener, [run.token]):
            self.note(f"{listener.id} drops {run.timer_id} token {run.token}: lease lost")
            return False
        return True

    def start(self, listener: VListener, run: Run) -> None:
        timer = self.timers[run.timer_id]
        what = f"{listener.id} starts {run.timer_id} token {run.token} ({run.source}, " \
               f"reruns {run.reruns})"
        self.note(what)
        if not self.lease_held(run):
            self.violate("fenced", f"{what} without holding its lease")
        if timer.status == "cancelled":
            self.violate("cancelled_ran", f"{what} after cancel returned 1")
        if self.now < timer.due:
            self.violate("early", f"{what} {timer.due - self.now} ms before its due time")
        if timer.reruns_started and run.reruns <= max(timer.reruns_started):
            self.violate("uncounted", f"{what}: started before with reruns "
                         f"{timer.reruns_started}, this start is not counted as a rerun")
        timer.reruns_started.append(run.reruns)
        if timer.key:
            # a run another listener took over (its token gone from Redis: recovered, its
            # slot passed to the rerun) is a paused process going on with the run it was
            # in: invariant 1's one exception (design invariant 12), a late finish
            running = {e.timer_id for e in self.executing.values() if e.key == timer.key
                       and self.r.hexists(KS.running_records, e.token)}
            running.add(timer.id)
            if len(running) > KEY_LIMITS[timer.key]:
                self.violate("key_limit", f"{what}: key {timer.key} (limit "
                             f"{KEY_LIMITS[timer.key]}) runs {sorted(running)} at once")
        if timer.rated:
            if (self.last_rated_start is not None
                    and self.now - self.last_rated_start < RATE_INTERVAL_MS):
                self.violate("rate", f"{what}: {self.now - self.last_rated_start} ms after "
                             f"the last start of rate {RATE_NAME} (interval {RATE_INTERVAL_MS})")
            self.last_rated_start = self.now
        self.executing[run.token] = Executing(run.token, timer.id, timer.key, listener.id,
                                              run.reruns, run.source)
        listener.executing[run.token] = run

    def inherited_slots(self, asked: list[GateRun]) -> set[str]:
        """The runs asked about that hold their key's slot already: a rerun given the slot
        of the run it replaces (``transfer_slot``: the rerun goes first, in the place its
        first run had), or a run handed over with it."""
        return {g.token for g in asked
                if g.key and self.r.zscore(KS.slots(g.key), g.token) is not None}

    def check_fifo(self, run: Run, how: str) -> None:
        """A run of a key got its slot: no timer of that key that goes before it (priority,
        due, scheduling order), due, claimed (by a live lease, or by one that lapsed and
        that no claim recovered yet: its listener may renew it and go on) or waiting in a
        flow queue, is left waiting."""
        timer = self.timers[run.timer_id]
        if not timer.key or timer.reruns_started:
            return  # a rerun (its run cut off) goes first: its place is its first run's
        slots = {as_text(m) for m in self.r.zrange(KS.slots(timer.key), 0, -1)}
        waiting_runs: dict[str, str] = {}
        for token, text in self.r.hgetall(KS.running_records).items():
            token_text = as_text(token)
            timer_id = run_record.decode(as_text(text))[3]
            if (token_text not in self.executing and token_text != run.token
                    and token_text not in slots  # holds a slot: not waiting for one
                    and not any(token_text in li.nexts or token_text in li.holding
                                for li in self.listeners)  # next in line, or screened
                    and self.lease_until(Run.parse(token, text, "s")) is not None):
                lapsed = "" if self.lease_held(Run.parse(token, text, "s")) else " (lapsed)"
                waiting_runs[timer_id] = f"claimed as token {token_text}{lapsed}"
        parked = {as_text(k): as_text(v) for k, v in self.r.hgetall(KS.parked).items()}
        for other in self.timers.values():
            if (other.id == timer.id or other.key != timer.key or other.status != "live"
                    or other.due > self.now or other.order() >= timer.order()
                    or any(e.timer_id == other.id for e in self.executing.values())):
                continue
            state = parked.get(other.id, "")
            where = waiting_runs.get(other.id) or (  # "C": promoted, a slot kept for it
                f"waiting in a flow queue ({state})" if state and state[0] != "C" else "")
            if where:
                self.violate("fifo", f"{run.timer_id} (order {timer.order()}) got key "
                             f"{timer.key}'s slot by {how} while {other.id} (order "
                             f"{other.order()}) ahead of it is {where}")

    def finish(self, listener: VListener, token: str, kind: str, delay_ms: int,
               gate: bool = True) -> None:
        """End run ``token``; the runs handed along start (or ask their gate) at once,
        or, without ``gate``, at the listener's next ``start_due`` (it stalled between
        reading the reply and gating them)."""
        run = listener.executing.pop(token)
        self.executing.pop(token, None)
        timer = self.timers[run.timer_id]
        # the run's function returned: a run next in line after it starts now, in its
        # thread, before this ending is written (runner.py)
        for following in [n for n in listener.nexts.values() if n.follows == token]:
            del listener.nexts[following.token]
            if (limits_of(following.record_text) or ("", 0, ""))[2]:
                # a rate to ask about: it waits for the run before it to end, then asks
                # the gate (executor.py ``_turn_before``, ``_may_follow_in_thread``)
                listener.claimed[following.token] = (following, self.now)
                continue
            if (self.fenced or self.local_fence) \
                    and self.must_ask(listener, following.token, self.now) \
                    and following.token in self.renew(listener, [following.token]):
                self.note(f"{listener.id} drops next {following.timer_id}: lease lost")
                continue
            listener.holding.add(following.token)
            self.start(listener, following)
        if kind == "ok":
            ending = (token, "ok", "", "")
        elif kind == "dead":
            ending = (token, "fail", f"{run.escaped_id}:{token}", "{}")
        else:
            options = record_options(run.record_text)
            options.pop("w", None)
            options["a"] = str(int(options.get("a", "0")) + 1)
            task = run_record.record_head(run.record_text)[0]
            retry = task + "".join(f";{k}={v}" for k, v in options.items()) + ":[]"
            ending = (token, "retry", f"{run.escaped_id}:{retry}", str(delay_ms))
        freeing = token in listener.holding
        listener.holding.discard(token)
        take = min(1, listener.free_slots()) if freeing else 0
        taker = Taker(listener.id, listener.groups, take, LEASE_MS, freeing)
        reply = self.s.finish(retention_ms=60_000, endings=[ending], taker=taker)
        listener.held.discard(token)
        late = int(reply[0] or 0)
        self.note(f"{listener.id} finishes {run.timer_id} token {token}: {kind}"
                  f"{' (late)' if late else ''}")
        if not late:
            self._ended(timer, kind, ending)
        items = reply[1:]
        nexts = []
        for i in range(0, len(items), 3):
            handed = Run.parse(*items[i:i + 3])
            listener.held.add(handed.token)
            listener.held_until[handed.token] = self.now + LEASE_MS // 2
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

    def _ended(self, timer: TimerModel, kind: str, ending: tuple[str, str, str, str]) -> None:
        if kind == "ok":
            timer.status = "done"
        elif kind == "dead":
            timer.status = "dead"
        elif self.r.hexists(KS.records, timer.id):  # the retry is pending
            timer.record = ending[2].partition(":")[2]
            timer.due = int(self.r.zscore(KS.due, timer.id) or self.now)
            timer.incarnation += 1
            timer.reruns_started = []

    def hand_back(self, listener: VListener, token: str) -> None:
        """A listener stopping (or out of memory) hands back a run it has not started."""
        listener.claimed.pop(token, None)
        listener.nexts.pop(token, None)
        listener.held.discard(token)
        self.s.finish(retention_ms=60_000, endings=[(token, "release", "", "")])
        self.note(f"{listener.id} hands back token {token}")

    def kill(self, listener: VListener) -> None:
        listener.alive = False
        for token in listener.executing:
            self.executing.pop(token, None)
        self.note(f"{listener.id} killed")

    # -- whole-world checks

    def check_nothing_lost(self) -> None:
        runs = {run_record.decode(as_text(v))[3] for v in self.r.hvals(KS.running_records)}
        pending = {as_text(k) for k in self.r.hkeys(KS.records)}
        for timer in self.timers.values():
            if timer.status == "live" and timer.id not in runs and timer.id not in pending:
                self.violate("lost", f"{timer.id} is neither pending nor claimed nor done")
