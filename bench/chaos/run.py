"""Running a chaos test: the world, the generator's plan on the clock, the nemesis beside
it, the drain, the final state, the checker's verdict; and the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import redis

from bench.chaos import checker, generator, nemesis
from bench.chaos.checker import Cancel, History, Move, Scheduled, Verdict
from bench.chaos.generator import Op, Profile, Spec
from bench.chaos.history import (
    completed,
    dead_timers,
    load,
    pending_ids,
    read_ledger,
    read_stalls,
    save,
)
from bench.chaos.world import PROXIED, SUPERVISED, World
from bench.faults.processes import REPO
from timers import Timers, TimersError, TimerSpec

LEASE = 2.0
"""``--lease`` of every listener: pauses and partitions outlast it."""
SHORT = Profile(seconds=140.0, fault_gap=(3.0, 7.0), devices=5, commands=4, plain_per_2s=12,
                move_batch=1000, move_burst=800, faults=nemesis.SINGLE, drain_seconds=50.0)
"""``--short``: what ``.ci/run`` runs (about 2.5 minutes on a 2-core machine)."""
WRITE_ERRORS = (TimersError, redis.RedisError, OSError)


def long_profile(minutes: float, topology: str) -> Profile:
    """``--minutes N``: the same mix, N minutes long, one move every ten minutes."""
    return Profile(seconds=minutes * 60, fault_gap=(3.0, 7.0), devices=6, commands=5,
                   plain_per_2s=16,
                   moves=max(1, round(minutes / 10)), move_batch=3000, move_burst=1500,
                   faults=nemesis.FAULTS[topology], drain_seconds=90.0)


@dataclass
class Outcome:
    """What a run did and what the checker found."""

    seed: int
    topology: str
    profile: Profile
    verdict: Verdict
    mix: Counter[str]
    started: Counter[str]
    done: Counter[str]
    faults: Counter[str]
    problems: list[str] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    """Each fault: when (s from the start), what, how long."""
    workdir: Path | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No violation."""
        return self.verdict.ok


class Runner:
    """Carries out the generator's plan and writes down what it did."""

    def __init__(self, world: World, profile: Profile) -> None:
        self.world, self.profile = world, profile
        self.source = world.timers(world.source)
        self.target = world.timers(world.target)
        self.history = History(limits=dict(generator.LIMITS),
                               rates={generator.RATED: generator.RATE_INTERVAL_MS,
                                      generator.KEYRATED: generator.RATE_INTERVAL_MS})
        for key in generator.KEY_PREFIX.values():
            for device in range(profile.devices):
                self.history.limits[f"{key}:{device}"] = 1
        self.last_due: dict[str, float] = {}
        self.mix: Counter[str] = Counter()
        self.problems: list[str] = []
        self.poisons = 0
        self.slows = 0

    def close(self) -> None:
        """Close the clients."""
        self.source.close()
        self.target.close()

    def do(self, op: Op) -> None:
        """Carry out one operation of the plan."""
        if op.kind == "schedule":
            self.schedule(op.specs)
        elif op.kind == "cancel":
            self.cancel(op.tids)
        elif op.kind == "move":
            self.move(op.task)

    def schedule(self, specs: Sequence[Spec]) -> None:
        """Schedule ``specs`` in the source prefix; a keyed timer is due after the one
        ahead of it on its key. A write refused (a fault) is tried again while the first
        of them is not yet due; given up, those timers are left out of the checks."""
        with self.world.writes:
            now = time.time()
            dues = {}
            for spec in specs:
                at = now + spec.delay
                if spec.fifo_key is not None:
                    at = max(at, self.last_due.get(spec.fifo_key, 0.0) + 0.02)
                    self.last_due[spec.fifo_key] = at
                dues[spec.tid] = at
            timer_specs = [TimerSpec(s.task, s.args, at=datetime.fromtimestamp(dues[s.tid], UTC),
                                     id=s.tid, key=s.key) for s in specs]
            deadline = min(dues.values()) - 0.3
            while True:
                try:
                    self.source.schedule_many(timer_specs)
                    break
                except WRITE_ERRORS as exc:
                    if time.time() > deadline:
                        self.problems.append(f"{len(specs)} timers not scheduled ({exc}); "
                                             f"left out of the checks")
                        return
                    time.sleep(0.2)
        for spec in specs:
            self.mix[spec.task] += 1
            self.history.scheduled[spec.tid] = Scheduled(
                spec.tid, spec.task, dues[spec.tid] * 1000, spec.fifo_key, spec.seq,
                spec.must_complete, spec.moved)

    def cancel(self, tids: Sequence[str]) -> None:
        """Cancel each of ``tids``, writing down what ``cancel`` returned."""
        with self.world.writes:
            for tid in tids:
                at = time.monotonic()
                try:
                    cancelled = self.source.cancel(tid)
                except WRITE_ERRORS:
                    self.history.scheduled.pop(tid, None)  # unknown: left out
                    continue
                self.history.cancels.append(Cancel(tid, at, cancelled))
                self.mix["cancel (True)" if cancelled else "cancel (False)"] += 1

    def move(self, task: str) -> None:
        """``timers move --task TASK --to-prefix <target>``, as a user runs it."""
        with self.world.writes:
            start = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "timers", "move", "--to-prefix", self.world.target,
                 "--task", task, "--url", self.world.url, "--prefix", self.world.source],
                cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
            end = time.monotonic()
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        line = said[-1] if said else f"exit {done.returncode}"
        if done.returncode != 0:
            self.problems.append(f"timers move exited {done.returncode}: {line}")
        self.history.moves.append(Move(task, start, end,
                                       frozenset({SUPERVISED, PROXIED}), line))
        self.mix["move"] += 1

    def schedule_poison(self) -> str:
        """A poison timer amid a burst of quick ones due with it: what the poison's
        process had finished must not run again."""
        self.poisons += 1
        spec = generator.poison_spec(self.poisons)
        burst = [Spec(f"{spec.tid}-{n:03d}", generator.PLAIN, [0.0], spec.delay)
                 for n in range(generator.POISON_BURST)]
        self.schedule([spec, *burst])
        return f"{spec.tid} amid {len(burst)} quick timers"

    def schedule_slow(self) -> str:
        """Plain timers due at once whose tasks outlast a listener's shutdown timeout; the
        prefix of their ids."""
        self.slows += 1
        self.schedule(generator.slow_specs(self.slows))
        return generator.slow_prefix(self.slows)

    def recurrences(self, on: bool) -> None:
        """Declare the two recurrences (an interval and a cron with seconds), or remove
        them."""
        with self.world.writes:
            if on:
                self.source.every("chaos-every", generator.TICK, interval=2.0)
                self.source.every("chaos-cron", generator.TICK, cron="* * * * * */3")
            else:
                for name in ("chaos-every", "chaos-cron"):
                    with contextlib.suppress(*WRITE_ERRORS):
                        self.source.unschedule_recurring(name)

    def settled(self) -> bool:
        """Every timer that must complete did, and nothing is pending or running."""
        done = completed(read_ledger(self.world.ledger))
        cancelled = {c.tid for c in self.history.cancels if c.cancelled}
        if any(t.must_complete and tid not in done and tid not in cancelled
               for tid, t in self.history.scheduled.items()):
            return False
        return all(s.pending == 0 and s.running == 0
                   for s in (self.source.stats(), self.target.stats()))


def run(seed: int, profile: Profile, topology: str = "server", binary: str | None = None,
        keep: Path | None = None, say: bool = True) -> Outcome:
    """One chaos run from fresh servers to the checker's verdict."""
    begun_wall = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"timers-chaos-{seed}-"))
    ledger = workdir / "ledger.jsonl"
    ledger.touch()
    world = World(workdir, ledger, LEASE, topology, binary)
    ops = generator.workload(seed, profile)
    planned = nemesis.schedule(seed, profile.seconds, profile.faults, LEASE,
                               profile.fault_gap)
    problems: list[str] = []
    try:
        world.start()
        _wait_listeners(world)
        runner = Runner(world, profile)
        bad = nemesis.Nemesis(world, planned, runner.schedule_poison, runner.schedule_slow)
        try:
            runner.recurrences(True)
            begun = time.monotonic()
            bad.start(begun)
            for op in ops:
                delay = begun + op.at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                runner.do(op)
            time.sleep(max(0.0, begun + profile.seconds - time.monotonic()))
            bad.stop()
            runner.recurrences(False)
            if say:
                print(f"  workload over after {time.monotonic() - begun:.0f} s; draining",
                      flush=True)
            deadline = time.monotonic() + profile.drain_seconds
            while time.monotonic() < deadline:
                with contextlib.suppress(*WRITE_ERRORS):
                    if runner.settled():
                        break
                time.sleep(0.5)
            else:
                problems.append(f"not settled {profile.drain_seconds:g} s after the workload "
                                f"(what never completed counts as lost; the servers' keys "
                                f"as they were then: {UNSETTLED})")
                try:
                    snapshot(world.url, workdir / UNSETTLED)
                except Exception as exc:  # the verdict matters more than the snapshot
                    problems.append(f"the servers' keys could not be read: {exc!r}")
            bad.settle()
            time.sleep(0.6)  # a revival under way ends
            problems += world.check_alive()
            world.stop_listeners()
            history = runner.history
            history.marks = read_ledger(ledger)
            history.cuts = list(bad.cuts) + nemesis.stall_cuts(read_stalls(ledger), world.lease)
            try:
                for timers in (runner.source, runner.target):
                    history.dead += dead_timers(timers)
                history.left_in_source = pending_ids(runner.source, generator.MOVED)
            except WRITE_ERRORS as exc:
                problems.append(f"the final state could not be read: {exc}")
            problems += runner.problems + bad.problems + bad.revived
            faults = bad.counts()
            timeline = [f"{i.start - begun:6.1f} s  {i.kind:9s} {i.what} "
                        f"({i.end - i.start:.1f} s)" for i in bad.injected]
        finally:
            bad.close()
            runner.close()
    finally:
        world.close()
    save(history, workdir)
    verdict = checker.check(history, generator.POISON)
    started, done = Counter[str](), Counter[str]()
    for mark in history.marks:
        if mark.kind == "S":
            started[mark.task] += 1
        elif mark.ok:
            done[mark.task] += 1
    outcome = Outcome(seed, topology, profile, verdict, runner.mix, started, done, faults,
                      problems, history.moves, timeline, workdir, time.monotonic() - begun_wall)
    _keep(outcome, keep)
    return outcome


UNSETTLED = "redis-unsettled.json"
"""Where a run that did not settle writes the servers' keys (kept with the ledger)."""


def snapshot(url: str, path: Path) -> None:
    """Every key of the server (every primary of a cluster) at ``url`` as JSON, by name:
    its type and its value (a zset as [member, score] pairs), to read what kept a timer
    from running: its key's slots, queue and order barrier."""
    def text(value: bytes | str) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    out: dict[str, dict[str, object]] = {}
    with Timers(url) as timers:
        client = timers.redis
        for name in client.scan_iter(count=1000):
            kind = text(client.type(name))
            value: object = None
            if kind == "string":
                value = text(client.get(name))
            elif kind == "hash":
                value = {text(k): text(v) for k, v in client.hgetall(name).items()}
            elif kind == "zset":
                value = [[text(m), score] for m, score in client.zrange(name, 0, -1,
                                                                      withscores=True)]
            elif kind in ("set", "list"):
                value = sorted(text(m) for m in (client.smembers(name) if kind == "set"
                                                 else client.lrange(name, 0, -1)))
            out[text(name)] = {"type": kind, "value": value}
    path.write_text(json.dumps(out, sort_keys=True, indent=0))


def _wait_listeners(world: World) -> None:
    """Until every listener process subscribed (each writes a heartbeat)."""
    from bench.faults.processes import wait_for

    expected = sum(listener.processes for listener in world.listeners.values())

    def ready() -> bool:
        problems = world.check_alive()
        if problems:
            raise RuntimeError("; ".join(problems))
        with Timers(world.url, prefix=world.source) as a, \
                Timers(world.url, prefix=world.target) as b:
            return len(a.listeners()) + len(b.listeners()) >= expected

    wait_for(ready, 60, f"{expected} listener processes to start")


def _keep(outcome: Outcome, keep: Path | None) -> None:
    workdir = outcome.workdir
    if workdir is None:
        return
    if keep is not None:
        target = keep / workdir.name
        shutil.copytree(workdir, target, dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
        outcome.workdir = target
    elif outcome.ok and not outcome.problems:
        shutil.rmtree(workdir, ignore_errors=True)
        outcome.workdir = None


def table(outcome: Outcome) -> str:
    """The run as Markdown: the workload mix, the faults by kind, each violation count."""
    v = outcome.verdict
    lines = [f"seed {outcome.seed}, {outcome.topology}, {outcome.profile.seconds:g} s of "
             f"workload and faults, {outcome.seconds:.0f} s in all", "",
             "| task / operation | scheduled | starts | completed |", "|---|---:|---:|---:|"]
    for task in sorted(set(outcome.mix) | set(outcome.started)):
        lines.append(f"| {task} | {outcome.mix.get(task, 0)} | "
                     f"{outcome.started.get(task, 0)} | {outcome.done.get(task, 0)} |")
    lines += ["", "| fault | injected |", "|---|---:|"]
    for kind in outcome.profile.faults:
        lines.append(f"| {kind} | {outcome.faults.get(kind, 0)} |")
    lines += ["", "| violation | count |", "|---|---:|"]
    lines += [f"| {name} | {v.counts.get(name, 0)} |" for name in checker.VIOLATIONS]
    lines += ["", "| note (not a violation) | count |", "|---|---:|"]
    lines += [f"| {name} | {v.notes.get(name, 0)} |" for name in checker.NOTES]
    for name in checker.VIOLATIONS:
        for example in v.examples.get(name, []):
            lines.append(f"- {name}: {example}")
    lines += [f"- fault at {t}" for t in outcome.timeline]
    lines += [f"- timers move: {m.said}" for m in outcome.moves]
    lines += [f"- run problem: {p}" for p in outcome.problems]
    if outcome.workdir is not None:
        lines.append(f"- ledger and listener logs kept in {outcome.workdir}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    from bench import chaos

    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=chaos.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--short", action="store_true",
                      help="the CI profile: one server, about 2.5 minutes")
    size.add_argument("--minutes", type=float, help="the long profile, this many minutes")
    parser.add_argument("--seed", type=int, help="replay this seed (default: a new one)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--cluster", action="store_true",
                       help="a 3-primary Redis Cluster with a replica each")
    where.add_argument("--sentinel", action="store_true",
                       help="a primary, a replica and 3 sentinels")
    parser.add_argument("--faults", metavar="KIND[,KIND]",
                        help="only these faults (default: every one the topology takes)")
    parser.add_argument("--server", help="redis-server/valkey-server binary")
    parser.add_argument("--keep", type=Path, help="keep the ledger and logs here")
    parser.add_argument("--check", type=Path, metavar="DIR",
                        help="judge a kept run's history again (its ledger.jsonl and "
                             "history.json), start nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: run (or ``--check``) and print the table; 1 on a violation."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.check is not None:
        verdict = checker.check(load(args.check), generator.POISON)
        for name in checker.VIOLATIONS + checker.NOTES:
            count = verdict.counts.get(name, 0) or verdict.notes.get(name, 0)
            print(f"{name}: {count}")
            for example in verdict.examples.get(name, []):
                print(f"  {example}")
        return 0 if verdict.ok else 1
    topology = "cluster" if args.cluster else "sentinel" if args.sentinel else "server"
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be more than 0")
    profile = long_profile(args.minutes, topology) if args.minutes else \
        replace(SHORT, faults=nemesis.FAULTS[topology])
    if topology == "cluster":
        profile = replace(profile, moves=0)  # timers move takes prefixes of one shard
    if args.faults:
        kinds = tuple(args.faults.split(","))
        unknown = [k for k in kinds if k not in nemesis.FAULTS[topology]]
        if unknown:
            parser.error(f"fault(s) {', '.join(unknown)} not on {topology}; known: "
                         f"{', '.join(nemesis.FAULTS[topology])}")
        profile = replace(profile, faults=kinds)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    again = ["python -m bench.chaos",
             f"--minutes {args.minutes:g}" if args.minutes else "--short"]
    again += [f"--{topology}"] if topology != "server" else []
    again += [f"--faults {args.faults}"] if args.faults else []
    print(f"seed {seed} (replay: {' '.join(again)} --seed {seed})", flush=True)
    outcome = run(seed, profile, topology, args.server, args.keep)
    print()
    print(table(outcome))
    print(f"\nseed {seed}: {'no violation' if outcome.ok else 'VIOLATIONS FOUND'}")
    return 0 if outcome.ok else 1
