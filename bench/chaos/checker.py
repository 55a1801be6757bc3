"""The checker: what a chaos run's history says, as counts of each violation.

Pure: it reads a :class:`History` (the ledger's lines, what was scheduled, cancelled and
moved, the faults with the processes they cut, the final state read from Redis) and
starts nothing, so ``tests/unit/test_chaos_checker.py`` drives it with hand-made histories.

Words used below:

- a **run** is one start line and the end line written by the same process for the same
  timer (a recurrence's occurrence is its own timer);
- a **cut** is a fault that may leave a run without its ending: the death of its process
  (``kill -9``, a poison's ``os._exit``, counted from the kill to when the process was seen
  gone), a ``SIGSTOP`` past the lease (from the stop to the ``SIGCONT``), a partition of its
  listener from Redis (from the cut to the heal), Redis out of reach of every listener (a
  restart, a failover, a slot migration: from its start to a lease after its end; a Cluster
  primary's death also from when every shard began to refuse commands), a stall of its
  process past half a lease that no fault caused (the machine's: a tick thread in every
  listener notes each, :mod:`bench.fault_tasks.stall_watch`; the design treats it as a
  pause, and the checker counts them). A run is
  cut when it started before the cut's end and had not ended :data:`ENDING_GRACE` before
  its start (an ending returned just before a kill may not be written yet);
- a **death** is a cut that killed a process (not a pause, not a partition);
- a start is dated from its **fence**: the listener checks the run's lease right before
  the call, and a ``SIGSTOP`` between that check and the task's first line is allowed,
  which no check can close (the task reads ``still_held()`` False then, as a task paused
  after its first line does). The ledger says when the fence let each run start
  (:mod:`bench.fault_tasks.fence_probe`): a start line whose check came before a stop of
  its process and whose line came after it is dated from the check. A start no fence
  checked is a violation. (A ledger without the fence's times, from before the probe:
  a start line written within :data:`RESUME_GRACE` after a ``SIGCONT`` with a token older
  than one already started is dated from the stop.)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

ENDING_GRACE = 0.25
"""Seconds before a cut in which a run that returned may not have written its ending."""
RESUME_GRACE = 0.02
"""For a ledger without the fence's times: seconds after a ``SIGCONT`` in which a start
line of the resumed process was checked before its stop (see the module's words)."""
RATE_SLACK_MS = 20.0
"""How much closer than its interval two starts of a rate may come (the gate's own jitter
is 5 ms and a run's start window 10 ms, ``timers.listener.flow.gate.START_WINDOW_S``; the
rest is the measuring, see :func:`_rates`)."""
EVERY = "*"
"""The listener an outage cuts: every one."""
DEATHS = ("kill", "poison")
"""Cut kinds that killed a process."""

LOST = "lost"
TWICE = "completed twice"
STARTED_TWICE = "started twice without a cut"
OLDER_TOKEN = "older token after a newer one"
OVER_LIMIT = "runs of one key beyond its limit"
FIFO = "FIFO per key broken"
RATE = "starts closer than the rate"
DEAD_NO_DEATH = "dead without the deaths to prove it"
DEAD_OTHER = "dead for another reason"
LEFT_BEHIND = "left behind by move"
RAN_CANCELLED = "ran after a cancel"
UNFENCED = "started with no fence asked"
UNCOUNTED = "started again with no rerun or retry counted"
VIOLATIONS = (LOST, TWICE, STARTED_TWICE, UNCOUNTED, UNFENCED, OLDER_TOKEN, OVER_LIMIT, FIFO,
              RATE, DEAD_NO_DEATH, DEAD_OTHER, LEFT_BEHIND, RAN_CANCELLED)
"""Every violation the checker counts, in the order it reports them."""

LATE_FINISH = "late finish (its process paused past the lease, overlapped its key's next)"
EXPLAINED = "second starts explained by a cut"
RETRIED = "second starts after a failed attempt (retries)"
STALE_HELD = "starts with an older token where still_held() said True"
FIFO_OUTAGE = "FIFO breaks (counted above) while Redis was out of reach (failover, restart)"
RESUMED = "starts after a SIGCONT, checked before the stop (dated from the check)"
STALLED = "stalls of a process past half a lease that no fault caused (counted as cuts)"
NOTES = (LATE_FINISH, EXPLAINED, RETRIED, STALE_HELD, FIFO_OUTAGE, RESUMED, STALLED)
"""What the checker counts that is not a violation."""


@dataclass(frozen=True)
class Mark:
    """One ledger line (:mod:`bench.fault_tasks.chaos`)."""

    kind: str
    """``S`` (the task's code starts) or ``E`` (it returned or raised)."""
    tid: str
    task: str
    pid: int
    mono: float
    """CLOCK_MONOTONIC seconds: one clock for every process of the machine."""
    token: int = 0
    held: bool = True
    listener: str = "?"
    redis_ms: float = 0.0
    attempt: int = 1
    original_due_ms: int = 0
    recurrence: str | None = None
    key: str | None = None
    seq: int | None = None
    ok: bool | None = None
    fenced: float | None = None
    """When the run's fence let it start (CLOCK_MONOTONIC s), for a start line."""
    fence_known: bool = False
    """Whether the line says when its fence let it start (None there: no fence asked)."""

    @property
    def run_of(self) -> str:
        """The timer this run belongs to (an occurrence of a recurrence: by its time)."""
        return f"{self.tid}@{self.original_due_ms}" if self.recurrence else self.tid

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Mark:
        """A mark from a ledger line's JSON object."""
        def opt_int(name: str) -> int | None:
            value = data.get(name)
            return None if value is None else int(str(value))

        ok = data.get("ok")
        return cls(
            kind=str(data["k"]), tid=str(data["id"]), task=str(data.get("task", "")),
            pid=int(str(data["pid"])), mono=float(str(data["mono"])),
            token=int(str(data.get("tok", 0))), held=bool(data.get("held", True)),
            listener=str(data.get("lid", "?")), redis_ms=float(str(data.get("rms", 0))),
            attempt=int(str(data.get("att", 1))),
            original_due_ms=int(str(data.get("orig", 0))),
            recurrence=None if data.get("rec") is None else str(data["rec"]),
            key=None if data.get("key") is None else str(data["key"]),
            seq=opt_int("seq"), ok=None if ok is None else bool(ok),
            fenced=None if data.get("fchk") is None else float(str(data["fchk"])),
            fence_known="fchk" in data,
        )


@dataclass(frozen=True)
class Scheduled:
    """A timer the generator scheduled."""

    tid: str
    task: str
    due_ms: float = 0.0
    """Its due time (any clock: only compared with the due times of its key's timers)."""
    fifo_key: str | None = None
    """Its concurrency key, for the order check."""
    seq: int = 0
    """Its place among its key's timers: due order, ties by scheduling order."""
    must_complete: bool = True
    """False for what may legitimately never complete (a poison)."""
    moved: bool = False
    """In the batch ``timers move`` takes to the other prefix."""


@dataclass(frozen=True)
class Cancel:
    """A cancel the workload sent, and what it returned."""

    tid: str
    at: float
    """Monotonic s when the cancel was sent."""
    cancelled: bool
    """What ``cancel`` returned: True, the timer must never run after ``at``."""


@dataclass(frozen=True)
class Cut:
    """A fault that may leave a run without its ending (see the module's words)."""

    kind: str
    """``kill``, ``poison``, ``stop``, ``partition``, ``outage`` (Redis unreachable for
    every listener: a restart, a failover, a slot on the move; a lease lapses when the
    outage outlasts it, as when its process is stopped) or ``stall`` (a process that went
    without running past half a lease, no fault of the nemesis's:
    :mod:`bench.fault_tasks.stall_watch`)."""
    start: float
    end: float
    pids: frozenset[int] = frozenset()
    listener: str | None = None
    """A partition cuts every process of a listener; an outage, :data:`EVERY` one."""
    fresh_for: float | None = None
    """For a pause, a partition or an outage: how long after its start a run may still
    start while it lasts (a lease: the last renewal came before it; a start later than
    that is a start without a lease, which no cut explains). None: until its end."""

    def hits(self, mark: Mark) -> bool:
        """Whether ``mark`` was written by a process this cut hit."""
        return mark.pid in self.pids or self.listener in (EVERY, mark.listener)


@dataclass(frozen=True)
class Move:
    """One ``timers move`` of a task's timers from the source prefix."""

    task: str
    start: float
    end: float
    source_listeners: frozenset[str]
    said: str = ""


@dataclass(frozen=True)
class Dead:
    """A dead timer's record, as ``timers failed`` keeps it."""

    tid: str
    kind: str
    error_type: str
    message: str

    @property
    def crashed(self) -> bool:
        """Dead for its crashes (its process went away while holding it)."""
        return self.kind == "crashed" or self.error_type == "ProcessDied"


@dataclass
class History:
    """Everything a chaos run wrote down, and the final state read from Redis."""

    marks: list[Mark] = field(default_factory=list)
    scheduled: dict[str, Scheduled] = field(default_factory=dict)
    cancels: list[Cancel] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)
    """Concurrency key -> the most runs it may have at once."""
    rates: dict[str, float] = field(default_factory=dict)
    """Task -> the interval (ms) its starts keep."""
    dead: list[Dead] = field(default_factory=list)
    left_in_source: set[str] = field(default_factory=set)
    """Timers still pending in the source prefix of a move at the end."""


@dataclass
class Run:
    """One run: its start line and, if it wrote one, its end line."""

    start: Mark
    end: Mark | None = None


@dataclass
class Verdict:
    """How many of each violation, with examples, and the notes."""

    counts: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, what: str, example: str) -> None:
        """Count one ``what``, keeping the first examples."""
        self.counts[what] += 1
        if len(self.examples[what]) < 5:
            self.examples[what].append(example)


    @property
    def ok(self) -> bool:
        """No violation."""
        return not any(self.counts[v] for v in VIOLATIONS)


def runs_by_timer(marks: Iterable[Mark]) -> dict[str, list[Run]]:
    """The runs of each timer in start order, each start paired with the first end line its
    process wrote for that timer and token after it."""
    runs: dict[str, list[Run]] = defaultdict(list)
    open_: dict[tuple[str, int, int], list[Run]] = defaultdict(list)
    for mark in sorted(marks, key=lambda m: (m.mono, m.kind != "E")):
        slot = (mark.run_of, mark.pid, mark.token)
        if mark.kind == "S":
            run = Run(mark)
            runs[mark.run_of].append(run)
            open_[slot].append(run)
        elif mark.kind == "E" and open_[slot]:
            open_[slot].pop(0).end = mark
    return dict(runs)


def checked_before_stop(marks: Sequence[Mark], cuts: Sequence[Cut]) -> list[Mark]:
    """``marks``, each start line whose fence let it start before a stop of its process
    and that was written after that stop dated from its check (see the module's words).
    A line without the fence's time: dated from the stop when it was written within
    :data:`RESUME_GRACE` after the stop's end with a token older than one of its timer
    already started. (A start right after a resume with the newest token, a run claimed
    then, keeps its time.)"""
    stops = [c for c in cuts if c.kind == "stop"]
    first_start: dict[tuple[str, int], float] = {}
    for mark in marks:
        if mark.kind == "S":
            slot = (mark.run_of, mark.token)
            first_start[slot] = min(first_start.get(slot, mark.mono), mark.mono)
    out = []
    for mark in marks:
        if mark.kind != "S" or mark.fence_known:
            fenced = mark.fenced
            across = fenced is not None and any(
                mark.pid in c.pids and fenced <= c.start and c.end <= mark.mono for c in stops)
            out.append(dataclasses.replace(mark, mono=fenced)
                       if across and fenced is not None else mark)
            continue
        stop = next((c for c in stops if mark.pid in c.pids
                     and c.end <= mark.mono <= c.end + RESUME_GRACE), None)
        newer_before = stop is not None and any(
            token > mark.token and at < mark.mono
            for (run_of, token), at in first_start.items() if run_of == mark.run_of)
        out.append(dataclasses.replace(mark, mono=stop.start)
                   if stop is not None and newer_before else mark)
    return out


def deaths_of_poison(marks: Sequence[Mark], poison_task: str) -> list[Cut]:
    """Each start of the poison task killed its process: from there to the last line that
    process wrote (its other threads go on for the moment ``os._exit`` takes)."""
    last: dict[int, float] = {}
    for mark in marks:
        last[mark.pid] = max(last.get(mark.pid, mark.mono), mark.mono)
    return [Cut("poison", m.mono, last[m.pid], frozenset({m.pid})) for m in marks
            if m.kind == "S" and m.task == poison_task]


def cut_of(run: Run, cuts: Sequence[Cut]) -> Cut | None:
    """The first cut that may have left ``run`` without its ending."""
    for cut in cuts:
        latest = cut.end if cut.fresh_for is None else min(cut.end,
                                                           cut.start + cut.fresh_for)
        if cut.hits(run.start) and run.start.mono <= latest and (
                run.end is None or run.end.mono >= cut.start - ENDING_GRACE):
            return cut
    return None


def check(history: History, poison_task: str = "chaos.poison") -> Verdict:
    """Count every violation of ``history`` (see :data:`VIOLATIONS`)."""
    verdict = Verdict()
    cuts = list(history.cuts) + deaths_of_poison(history.marks, poison_task)
    marks = checked_before_stop(history.marks, cuts)
    verdict.notes[RESUMED] = sum(a is not b for a, b in zip(history.marks, marks, strict=True))
    stops = [c for c in cuts if c.kind == "stop"]
    verdict.notes[STALLED] = sum(
        not any(s.pids & c.pids and s.start <= c.end and c.start <= s.end for s in stops)
        for c in cuts if c.kind == "stall")
    for mark in history.marks:
        if mark.kind == "S" and mark.fence_known and mark.fenced is None:
            verdict.add(UNFENCED, f"{mark.tid} (token {mark.token}) in pid {mark.pid}")
    runs = runs_by_timer(marks)
    _once(history, runs, cuts, verdict)
    _tokens(runs, verdict)
    _limits(history, runs, cuts, verdict)
    _fifo(history, runs, cuts, verdict)
    _rates(history, verdict)
    _dead(history, runs, cuts, verdict)
    _moves(history, runs, verdict)
    return verdict


def _once(history: History, runs: Mapping[str, list[Run]], cuts: Sequence[Cut],
          verdict: Verdict) -> None:
    """Lost, completed twice, started twice without a cut, started again with no rerun or
    retry counted (its attempt not above the start before: a claim lost, a child of
    quarantine not counted), ran after a cancel."""
    cancelled = {c.tid: c for c in history.cancels if c.cancelled}
    for tid, timer in history.scheduled.items():
        mine = runs.get(tid, [])
        if tid in cancelled:
            late = [r for r in mine if r.start.mono >= cancelled[tid].at]
            if late:
                verdict.add(RAN_CANCELLED, f"{tid} started {len(late)} time(s) after its "
                                           f"cancel returned True")
            continue
        if timer.must_complete and not any(r.end is not None and r.end.ok for r in mine):
            verdict.add(LOST, f"{tid} ({timer.task}): {len(mine)} start(s), none completed")
    for tid, mine in runs.items():
        completed = [r for r in mine if r.end is not None and r.end.ok
                     and cut_of(r, cuts) is None]
        if len(completed) > 1:
            verdict.add(TWICE, f"{tid} completed {len(completed)} times, in pids "
                               f"{', '.join(str(r.start.pid) for r in completed)}")
        for previous, run in itertools.pairwise(mine):
            if (run.start.token >= previous.start.token  # (an older one: _tokens)
                    and run.start.attempt <= previous.start.attempt):
                verdict.add(UNCOUNTED, f"{tid} started in pid {run.start.pid} (token "
                                       f"{run.start.token}, attempt {run.start.attempt}) "
                                       f"{run.start.mono - previous.start.mono:.2f} s after a "
                                       f"start in pid {previous.start.pid} (attempt "
                                       f"{previous.start.attempt})")
            if (previous.end is not None and previous.end.ok is False
                    and previous.end.mono <= run.start.mono):
                verdict.notes[RETRIED] += 1
                continue
            cut = cut_of(previous, cuts)
            if cut is not None:
                verdict.notes[EXPLAINED] += 1
                continue
            how = ("it had completed" if previous.end is not None and previous.end.ok
                   else "it was still running" if previous.end is None
                   or previous.end.mono > run.start.mono else "it had ended")
            verdict.add(STARTED_TWICE,
                        f"{tid} started again in pid {run.start.pid} (token {run.start.token}) "
                        f"{run.start.mono - previous.start.mono:.2f} s after a start in pid "
                        f"{previous.start.pid} (token {previous.start.token}): {how}, and "
                        f"no fault cut that process")


def _tokens(runs: Mapping[str, list[Run]], verdict: Verdict) -> None:
    for tid, mine in runs.items():
        newest: Mark | None = None
        for run in mine:
            start = run.start
            if newest is not None and start.token < newest.token:
                verdict.add(OLDER_TOKEN, f"{tid} started with token {start.token} in pid "
                                         f"{start.pid} (still_held {start.held}) "
                                         f"{start.mono - newest.mono:.2f} s after token "
                                         f"{newest.token} started in pid {newest.pid}")
                if start.held:
                    verdict.notes[STALE_HELD] += 1
            if newest is None or start.token > newest.token:
                newest = start


def _limits(history: History, runs: Mapping[str, list[Run]], cuts: Sequence[Cut],
            verdict: Verdict) -> None:
    """At most a key's limit of runs at once. A run without an end lasts until its process
    was seen gone (a death), or for ever; a run whose process was paused or cut off while
    in it is left out, and counted as a late finish if it overlapped another."""
    horizon = max((m.mono for m in history.marks), default=0.0) + 1.0
    spans: dict[str, list[tuple[float, float, Mark]]] = defaultdict(list)
    excused: dict[str, list[tuple[float, float, Mark]]] = defaultdict(list)
    for mine in runs.values():
        for run in mine:
            key = run.start.key
            if key is None or key not in history.limits:
                continue
            cut = cut_of(run, cuts)
            if cut is not None and cut.kind not in DEATHS:
                end = run.end.mono if run.end is not None else horizon
                excused[key].append((run.start.mono, end, run.start))
                continue
            if run.end is not None:
                end = run.end.mono
            elif cut is not None:
                end = cut.end
            else:
                end = horizon
            spans[key].append((run.start.mono, end, run.start))
    for key, found in spans.items():
        limit = history.limits[key]
        for start, _, mark in found:
            at_once = [s for s in found if s[0] <= start < s[1]]
            if len(at_once) > limit:
                verdict.add(OVER_LIMIT, f"{key}: {len(at_once)} runs at once (limit {limit}) "
                                        f"as {mark.tid} started in pid {mark.pid}")
    for key, late in excused.items():
        for start, end, _ in late:
            if any(s < end and start < e for s, e, _ in spans.get(key, [])):
                verdict.notes[LATE_FINISH] += 1


def _fifo(history: History, runs: Mapping[str, list[Run]], cuts: Sequence[Cut],
          verdict: Verdict) -> None:
    """A key's timers first start in (due, scheduling) order."""
    by_key: dict[str, list[Scheduled]] = defaultdict(list)
    for timer in history.scheduled.values():
        if timer.fifo_key is not None:
            by_key[timer.fifo_key].append(timer)
    for key, timers in by_key.items():
        started = [(min(r.start.mono for r in runs[t.tid]), (t.due_ms, t.seq), t)
                   for t in timers if runs.get(t.tid)]
        started.sort(key=lambda item: item[0])
        for i, (at, order, timer) in enumerate(started):
            ahead = [t.tid for _, o, t in started[i + 1:] if o < order]
            if ahead:
                during = any(c.kind == "outage" and c.start <= at <= c.end for c in cuts)
                verdict.add(FIFO, f"{key}: {timer.tid} started before {len(ahead)} of its "
                                  f"key's timers due before it (e.g. {ahead[0]})"
                                  + (" during a Redis outage" if during else ""))
                if during:
                    verdict.notes[FIFO_OUTAGE] += 1


def _rates(history: History, verdict: Verdict) -> None:
    """Two starts of a rate closer than its interval (less :data:`RATE_SLACK_MS`) on the
    Redis clock as the listeners measured it, and on the machine's monotonic clock at the
    tasks' first lines. Each alone can err: a listener's estimate of the Redis clock is off
    by up to half the round trip it was measured with (over 100 ms on a busy machine), and
    a first line can come late after the gate let its run go; a start the gate let go too
    soon is too soon on both."""
    slack = RATE_SLACK_MS / 1000
    for task, interval in history.rates.items():
        starts = sorted((m for m in history.marks if m.kind == "S" and m.task == task),
                        key=lambda m: m.redis_ms)
        for before, after in itertools.pairwise(starts):
            gap = after.redis_ms - before.redis_ms
            seen = abs(after.mono - before.mono)
            if gap < interval - RATE_SLACK_MS and seen < interval / 1000 - slack:
                verdict.add(RATE, f"{task}: {after.tid} started {gap:.0f} ms after "
                                  f"{before.tid} on the Redis clock, {seen * 1000:.0f} ms "
                                  f"on the machine's (interval {interval:g} ms)")


def _dead(history: History, runs: Mapping[str, list[Run]], cuts: Sequence[Cut],
          verdict: Verdict) -> None:
    """A timer dead for crashes needs a death while a run of it went on; a timer that
    should complete is never dead for anything else."""
    deaths = [c for c in cuts if c.kind in DEATHS]
    for dead in history.dead:
        timer = history.scheduled.get(dead.tid)
        if dead.crashed:
            proof = [r for r in runs.get(dead.tid, []) if cut_of(r, deaths) is not None]
            if not proof:
                verdict.add(DEAD_NO_DEATH, f"{dead.tid}: {dead.message}")
        elif timer is None or timer.must_complete:
            verdict.add(DEAD_OTHER, f"{dead.tid}: {dead.error_type}: {dead.message}")


def _moves(history: History, runs: Mapping[str, list[Run]], verdict: Verdict) -> None:
    """After a move, no timer of its task starts in the source prefix, none is left
    pending there."""
    for move in history.moves:
        batch = [t.tid for t in history.scheduled.values() if t.moved and t.task == move.task]
        for tid in batch:
            late = [r for r in runs.get(tid, []) if r.start.mono > move.end
                    and r.start.listener in move.source_listeners]
            if late and not any(r.start.mono <= move.end for r in runs.get(tid, [])):
                verdict.add(LEFT_BEHIND, f"{tid} started in the source prefix "
                                         f"{late[0].start.mono - move.end:.1f} s after the "
                                         f"move ({move.said})")
            elif tid in history.left_in_source:
                verdict.add(LEFT_BEHIND, f"{tid} still pending in the source prefix at the "
                                         f"end ({move.said})")
