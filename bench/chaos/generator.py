"""The generator: a seeded plan of what the workload does and when, through the public API.

:func:`workload` turns a seed and a :class:`Profile` into a list of :class:`Op` (seconds
from the start, what to do). The same seed gives the same plan; the runner
(:mod:`bench.chaos.run`) carries it out on the clock, so when each timer comes due is
relative to when it was actually scheduled (a fault may hold writes back for a while).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench.fault_tasks import chaos as tasks

PLAIN, KEYFN, KEYARG, KEYASYNC = "chaos.plain", "chaos.keyfn", "chaos.keyarg", "chaos.keyasync"
RATED, CAPPED, FLAKY, POISON = "chaos.rated", "chaos.capped", "chaos.flaky", "chaos.poison"
TICK, MOVED, KEYRATED = "chaos.tick", "chaos.moved", "chaos.keyrated"
KEY_PREFIX = {KEYFN: "dev", KEYARG: "kdev", KEYASYNC: "adev", KEYRATED: "rdev"}
"""The concurrency key of a keyed task's timers: ``<prefix>:<device>``."""
RATE_INTERVAL_MS = 1000 * 1 / 4
""":data:`bench.fault_tasks.chaos.RATE` (4/s) as an interval: of :data:`RATED` and of
:data:`KEYRATED`, each a rate of its own."""
CAPPED_KEY = "task:chaos.capped"
LIMITS = {CAPPED_KEY: tasks.CAP}
"""Keys whose limit is not 1 (a keyed task's keys allow one run at once)."""


@dataclass(frozen=True)
class Spec:
    """One timer to schedule: due ``delay`` s after it is scheduled (at least; a keyed
    timer is never due before one scheduled ahead of it on its key)."""

    tid: str
    task: str
    args: list[object]
    delay: float
    key: str | None = None
    """Given at schedule (``key=``)."""
    fifo_key: str | None = None
    """Its key, where the order of its key's timers is checked."""
    seq: int = 0
    must_complete: bool = True
    moved: bool = False


@dataclass(frozen=True)
class Op:
    """Something the workload does ``at`` seconds from its start."""

    at: float
    kind: str
    """``schedule``, ``cancel`` (``tids``: cancel each) or ``move`` (of ``task``)."""
    specs: tuple[Spec, ...] = ()
    tids: tuple[str, ...] = ()
    task: str = ""


@dataclass(frozen=True)
class Profile:
    """Sizes of a run."""

    seconds: float
    """How long the workload and the nemesis go on (then everything is drained)."""
    fault_gap: tuple[float, float] = (6.0, 11.0)
    """Seconds between one fault's end and the next one's start (uniform)."""
    devices: int = 5
    """Devices per keyed task."""
    commands: int = 4
    """Commands per device per wave of a keyed task."""
    plain_per_2s: int = 16
    moves: int = 1
    move_batch: int = 1500
    move_burst: int = 400
    """Quick timers of the source prefix due as the move runs (its listener works)."""
    faults: tuple[str, ...] = ()
    drain_seconds: float = 60.0


@dataclass
class _Seqs:
    n: int = 0
    per_key: dict[str, int] = field(default_factory=dict)

    def next_id(self, prefix: str) -> str:
        """A new timer id."""
        self.n += 1
        return f"{prefix}{self.n:06d}"

    def next_seq(self, key: str) -> int:
        """The next place in ``key``'s order."""
        self.per_key[key] = self.per_key.get(key, 0) + 1
        return self.per_key[key]


def workload(seed: int, profile: Profile) -> list[Op]:
    """The seeded plan of ``profile``: every batch, cancel and move, in time order."""
    rng = random.Random(f"workload-{seed}")
    ids = _Seqs()
    ops: list[Op] = []
    end = profile.seconds - 12.0  # every timer due well before the drain
    t = 1.0
    while t < end:
        ops.append(_plain(rng, ids, t, profile.plain_per_2s))
        t += 2.0
    for task, first, every in ((KEYFN, 2.0, 8.0), (KEYARG, 4.0, 8.0), (KEYASYNC, 6.0, 8.0),
                               (KEYRATED, 7.0, 12.0)):
        t = first
        while t < end:
            ops.append(_keyed(rng, ids, t, task, profile))
            t += every
    t = 3.0
    while t < end:
        ops.append(Op(t, "schedule", tuple(
            Spec(ids.next_id("r"), RATED, [i], 1.0) for i in range(6))))
        t += 5.0
    t = 2.5
    while t < end:
        ops.append(Op(t, "schedule", tuple(
            Spec(ids.next_id("c"), CAPPED, [i, round(rng.uniform(0.2, 0.8), 2)], 1.0)
            for i in range(4))))
        t += 4.0
    t = 3.5
    while t < end:
        ops.append(Op(t, "schedule", tuple(
            Spec(ids.next_id("f"), FLAKY, [i, rng.choice([1, 2])], rng.uniform(0.5, 2.0))
            for i in range(3))))
        t += 6.0
    t = 5.0
    while t < end:
        batch = tuple(Spec(ids.next_id("x"), PLAIN, [0.0], 4.0) for _ in range(6))
        ops.append(Op(t, "schedule", batch))
        ops.append(Op(t + 1.5, "cancel",
                      tids=tuple(s.tid for s in rng.sample(batch, 3))))
        t += 7.0
    for n in range(profile.moves):
        at = profile.seconds * (n + 1) / (profile.moves + 1) * 0.8
        ops.extend(_move(rng, ids, at, profile))
    ops.sort(key=lambda op: op.at)
    return ops


def _plain(rng: random.Random, ids: _Seqs, at: float, n: int) -> Op:
    specs = []
    for _ in range(n):
        seconds = rng.choices([0.0, 0.05, 0.3, 1.0], weights=[6, 2, 1, 1])[0]
        specs.append(Spec(ids.next_id("p"), PLAIN, [seconds], rng.uniform(1.0, 3.0)))
    return Op(at, "schedule", tuple(specs))


def _keyed(rng: random.Random, ids: _Seqs, at: float, task: str, profile: Profile) -> Op:
    """A wave of commands: ``profile.commands`` per device, 0.3 s apart from a due time of
    its own, each working 0.4 to 1.6 s (0.05 to 0.3 s for :data:`KEYRATED`, whose rate
    also holds them back: with longer work its waves came faster than it ran them, and
    the last ones were still waiting when the run ended); one at a time per device."""
    specs = []
    for device in range(profile.devices):
        key = f"{KEY_PREFIX[task]}:{device}"
        first = rng.uniform(1.5, 3.0)
        for j in range(profile.commands):
            seq = ids.next_seq(key)
            seconds = round(rng.uniform(0.05, 0.3) if task == KEYRATED
                            else rng.uniform(0.4, 1.6), 2)
            tid = ids.next_id(f"k{KEY_PREFIX[task][0]}")
            if task == KEYARG:  # a sharded prefix keeps a keyed timer in its key's shard
                tid += "{" + key + "}"
            specs.append(Spec(tid, task,
                              [device, seq, seconds], first + 0.3 * j,
                              key=key if task == KEYARG else None, fifo_key=key, seq=seq))
    return Op(at, "schedule", tuple(specs))


def _move(rng: random.Random, ids: _Seqs, at: float, profile: Profile) -> list[Op]:
    """The batch to move (due 10 to 20 s after it is scheduled), a burst of quick timers
    of the source prefix due as the move runs (its listeners take timers off the due
    index ahead of the move's cursor), and the move, 3 s after the batch (the command
    takes most of a second to start)."""
    batch = tuple(Spec(ids.next_id("m"), MOVED, [i], rng.uniform(10.0, 20.0), moved=True)
                  for i in range(profile.move_batch))
    burst = tuple(Spec(ids.next_id("b"), PLAIN, [0.0], rng.uniform(3.4, 5.0))
                  for _ in range(profile.move_burst))
    return [Op(at, "schedule", batch + burst), Op(at + 3.0, "move", task=MOVED)]


POISON_BURST = 150
"""Quick timers due with each poison."""
SLOW_TIMERS, SLOW_SECONDS, SLOW_PREFIX = 6, 4.0, "s"
"""What a ``term`` fault schedules: tasks longer than a listener's 2 s shutdown timeout."""


def slow_specs(ids_seen: int) -> list[Spec]:
    """The slow timers a ``term`` or ``child`` fault schedules, due at once."""
    return [Spec(f"{slow_prefix(ids_seen)}{n}", PLAIN, [SLOW_SECONDS], 0.05)
            for n in range(SLOW_TIMERS)]


def slow_prefix(ids_seen: int) -> str:
    """What the ids of one batch of slow timers start with."""
    return f"{SLOW_PREFIX}{ids_seen:03d}-"


def poison_spec(ids_seen: int) -> Spec:
    """The poison timer a ``poison`` fault schedules."""
    return Spec(f"z{ids_seen:06d}", POISON, [ids_seen], 0.3, must_complete=False)

