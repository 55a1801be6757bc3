"""Run fault scenarios from a fresh server each to their verdict, and the command line."""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

import redis

from bench.faults.classic import CLASSIC_FAULTS, EXTRA_FAULTS
from bench.faults.hostile import HOSTILE_FAULTS
from bench.faults.processes import REPO, FaultError, sleep_until
from bench.faults.report import table
from bench.faults.scenario import (
    ON_TIME_MS,
    Fault,
    Plan,
    Result,
    Scenario,
    final_batch,
    main_batch,
)
from timers import TimersError
from timers.dev.server import EmbeddedServer, server_version

FAULTS: dict[str, Fault] = {f.name: f for f in CLASSIC_FAULTS + HOSTILE_FAULTS}
"""The faults of a full run, in order."""
EXTRA: dict[str, Fault] = {f.name: f for f in EXTRA_FAULTS}
"""Faults run only when named."""
Stopped = (FaultError, redis.RedisError, TimersError, subprocess.TimeoutExpired)
"""What ends a scenario early with a verdict from the ledger as it stands."""


def _play(fault: Fault, plan: Plan, s: Scenario, result: Result) -> None:
    """Listeners, the main batch, the fault, then the final batch; the verdicts."""
    if fault.start is not None:
        fault.start(s)
    else:
        for _ in range(2):
            s.start_listener()
    s.wait_subscribed()
    s.probe_events()
    start = time.time() + plan.lead_s
    fault_at = start + plan.spread_s * 0.4
    s.schedule(main_batch(plan, start, fault_at + fault.burst_delay, fault.slow_every,
                          fault.slow_seconds, plan.burst if fault.burst else 0), keys=plan.keys)
    if fault.extra is not None:
        fault.extra(s, fault_at)
    sleep_until(fault_at)
    fault.inject(s)
    s.wait_subscribed(15)  # back to normal by itself
    s.probe_events()
    final = final_batch(plan.final_timers, time.time() + 1.0)
    s.schedule(final)
    main_ids, final_ids = s.main_ids(), [tid for tid, _, _ in final]
    settled = fault.settled
    s.wait_done(main_ids + final_ids, plan.spread_s + plan.lead_s + fault.done_timeout,
                None if settled is None else functools.partial(settled, s))
    if fault.judge is not None:
        fault.judge(s)
    if plan.keys:
        most = s.most_at_once_per_key()
        s.evidence.append(f"most runs of one key at once: {most}")
        if most > 1:
            s.problems.append(f"{most} runs of one concurrency key at once (limit 1)")
    result.main = s.verdict(main_ids)
    result.final = s.verdict(final_ids)
    late = [x for x in result.final.lateness_ms if x > ON_TIME_MS]
    if late:
        result.problems.append(f"{len(late)} final-batch timers later than "
                               f"{ON_TIME_MS:g} ms (max {max(late):.0f} ms)")
    failures = s.failures()
    if failures:
        result.problems.append(f"{len(failures)} failure records, e.g. {failures[0].data}")
    counters = s.timers.stats().counters
    result.evidence.extend(s.evidence)
    result.problems.extend(s.problems)
    result.evidence.append("Redis counters: " + ", ".join(
        f"{k} {v}" for k, v in sorted(counters.items())))


def _stopped_early(fault: Fault, s: Scenario, result: Result, error: Exception) -> None:
    """The verdict from the ledger as it stands when a scenario could not go on."""
    result.problems.append(str(error) or type(error).__name__)
    if fault.judge is not None:
        with contextlib.suppress(*Stopped):
            fault.judge(s)
    result.evidence.extend(s.evidence)
    result.problems.extend(s.problems)
    with contextlib.suppress(Exception):
        result.main = s.verdict(s.main_ids())
        final_ids = [tid for tid in s.due_ms if tid.startswith("f")]
        result.final = s.verdict(final_ids) if final_ids else None


def _keep(fault: Fault, workdir: Path, keep: Path | None, result: Result) -> None:
    if keep is not None or not result.ok:
        target = (keep or Path(tempfile.gettempdir())) / f"timers-fault-{fault.name}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(workdir, target)
        result.evidence.append(f"logs and ledger kept in {target}")
    shutil.rmtree(workdir, ignore_errors=True)


def run_fault(fault: Fault, plan: Plan, binary: str | None = None,
              keep: Path | None = None) -> Result:
    """Run one scenario from a fresh server to its verdict."""
    result = Result(fault.name)
    begun = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"timers-fault-{fault.name}-"))
    server = EmbeddedServer(binary, config=REPO / "redis.conf",
                            extra_args=("--appendonly", "yes", *fault.server_args))
    scenario: Scenario | None = None
    try:
        server.start()
        scenario = Scenario(server, workdir, plan, fault.shutdown_timeout, fault.lease)
        try:
            _play(fault, plan, scenario, result)
        except Stopped as exc:
            _stopped_early(fault, scenario, result, exc)
    finally:
        if scenario is not None:
            for listener in scenario.live_listeners():
                code = listener.stop()
                if code not in (0, None) and not result.problems:
                    result.problems.append(f"listener {listener.pid} exited {code} on SIGTERM")
            scenario.close()
        server.stop()
        result.seconds = time.monotonic() - begun
        _keep(fault, workdir, keep, result)
    return result


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` stops its processes."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parser() -> argparse.ArgumentParser:
    from bench import faults

    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=faults.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller: a few minutes")
    parser.add_argument("--timers", type=int, help="timers per fault (default 3000; "
                                                   "600 with --quick)")
    parser.add_argument("--only", "--fault", dest="only", metavar="FAULT[,FAULT]",
                        help="comma-separated faults: " + ", ".join(FAULTS)
                        + "; also " + ", ".join(EXTRA))
    parser.add_argument("--server", help="redis-server/valkey-server binary")
    parser.add_argument("--keep", type=Path, help="copy each fault's logs and ledger here")
    parser.add_argument("--keys", type=int, default=0, metavar="N",
                        help="the main batch's timers share N concurrency keys, one run at "
                             "a time each (default 0: no key)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.keys < 0:
        parser.error("--keys must be 0 or more")
    plan = (Plan.quick(args.timers, args.keys) if args.quick
            else Plan(timers=args.timers or 3_000, keys=args.keys))
    names = args.only.split(",") if args.only else list(FAULTS)
    known = FAULTS | EXTRA
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(known)}")
    probe = EmbeddedServer(args.server)
    print(f"server {server_version(probe.binary)} ({probe.binary}), repository redis.conf "
          f"with appendonly yes; {plan.timers:,} timers over {plan.spread_s:g} s per fault "
          f"({plan.burst:,} of them at once where a fault needs a burst), 2 listener "
          f"processes, --lease {plan.lease:g} --concurrency {plan.concurrency}; final batch "
          f"{plan.final_timers} timers, on time = within {ON_TIME_MS:g} ms"
          + (f"; the main batch over {plan.keys} concurrency keys of limit 1"
             if plan.keys else ""), flush=True)
    results = []
    begun = time.monotonic()
    with _sigterm_raises():
        for name in names:
            print(f"{name}: {known[name].what} …", flush=True)
            result = run_fault(known[name], plan, args.server, args.keep)
            results.append(result)
            print(f"  {'pass' if result.ok else 'FAIL'} in {result.seconds:.1f} s", flush=True)
    print()
    print(table(results))
    print(f"\ntotal {time.monotonic() - begun:.0f} s")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
