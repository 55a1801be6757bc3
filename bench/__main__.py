"""``python -m bench [--quick] [--server PATH] [--only NAME[,NAME]] [--concurrency N]``.

``python -m bench --against REV`` and ``--peers`` run a same-sitting comparison instead
(:mod:`bench.compare`: every side in turn, scenario by scenario, N rounds).

Starts its own server (the repository's redis.conf), runs each scenario on a flushed
database under a deadline, prints one table with the settings used and writes it to
``bench/RESULTS.md`` (a full run of every scenario) or ``bench/RESULTS-partial.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, ModuleType

import redis

from bench import (
    cluster,
    events,
    fire,
    flow,
    idle,
    lateness,
    memory,
    observe,
    scale,
    schedule,
    workload,
)
from bench.common import REPO, Results, Row, ScenarioTimeout, Sizes, count, hard_limit, render
from bench.context import Context
from bench.server_stats import MachineSample, config_value, server_label, wait_for_quiet
from timers.dev.server import EmbeddedServer
from timers.listener import DEFAULT_CONCURRENCY

SCENARIOS: dict[str, ModuleType] = {
    "lateness": lateness,
    "schedule": schedule,
    "fire": fire,
    "workload": workload,
    "flow": flow,
    "memory": memory,
    "idle": idle,
    "events": events,
    "observe": observe,
    "scale": scale,
    "cluster": cluster,
}

FINDINGS = REPO / "bench" / "FINDINGS.md"
"""Written by hand: what each optimisation bought and why a missed target is out of reach."""

METHOD = """\
How these figures are taken (see each module's docstring in bench/):

- Every scenario starts on a flushed database with counters reset, runs under soft
  deadlines (a scenario that does not finish reports what it got) and a hard limit.
- Listeners run in child processes (`python -m bench.listener`), one `timers.Listener`
  each with the trivial task `noop` (a plain function: it runs in the listener's thread
  pool). Each child records `Fired` (due ms, start ms, path) from its observer and writes
  them to a file when it exits; it sends nothing to Redis but the listener's own traffic.
- Lateness is `Fired.lateness_ms`: task start minus due time on the Redis clock as the
  listener estimates it. Percentiles are nearest-rank (`timers.model.percentiles`).
- Background timers (the "1,000,000 pending" runs) are in the same prefix, so they sit in
  the same due index and their keys in the same expire table; they are due an hour out.
- Fire throughput is N / (last task start - due time); the N timers are scheduled before
  their common due time, with the listeners already running.
- Lateness is also checked by the task itself: its args carry the due time, and it
  notes `time.time()` at its start (the server runs on the same machine and clock).
- Bytes per timer is the INFO used_memory delta over N (allocator fragmentation not
  included); the notes split it with MEMORY USAGE.
- Idle commands are counted with MONITOR: commands the listener's connections send,
  not the ones its scripts call (INFO commandstats counts those too), minus our INFO.
- Redis CPU per timer or per fire is the INFO used_cpu delta over the measurement.
- The machine is shared by the server, the listener(s) and the producer: 2 cores here.
  "Others' CPU" is what other processes on the machine used while a figure was measured
  (% of one core, from /proc/stat minus the server's and the benchmark's own CPU); where
  it is high, the figure is lower (or later) than the code alone would give.
"""


def _settings(ctx: Context, binary: str, sizes: Sizes, args: argparse.Namespace,
              names: list[str]) -> list[tuple[str, str]]:
    r = ctx.r
    cores = os.cpu_count() or 0
    n_text = (f"lateness {count(sizes.spread_n)} over {sizes.spread_s:g} s and "
              f"{count(sizes.steady_rate)}/s for {sizes.steady_s:g} s with 0 and "
              f"{count(sizes.background_n)} pending; "
              f"fire {' and '.join(map(count, sizes.fire_ns))}; "
              f"memory {' and '.join(map(count, sizes.memory_ns))}; idle {count(sizes.idle_n)} "
              f"for {sizes.idle_s:g} s; schedule_many {count(sizes.many_n)}; "
              f"scale {count(sizes.scale_n)}")
    return [
        ("timers", _commit()),
        ("mode", ("quick" if sizes.quick else "full") + f", scenarios: {', '.join(names)}"),
        ("server", f"{server_label(r)} ({binary}), config {args.config}"),
        ("hz", config_value(r, "hz")),
        ("active-expire-effort", config_value(r, "active-expire-effort")),
        ("notify-keyspace-events", config_value(r, "notify-keyspace-events")),
        ("appendonly", "yes (everysec) as in redis.conf for lateness, schedule and fire; "
                       "turned off with CONFIG SET for the bulk loads (memory, idle, and "
                       "loading the background timers, after which it is turned back on "
                       "and its rewrite awaited before measuring)"),
        ("listener concurrency", str(ctx.concurrency)),
        ("N", n_text),
        ("machine", f"{cores} cores, {platform.machine()}, Linux {platform.release()}"),
        ("Python", f"{platform.python_version()}, redis-py {redis.__version__}"),
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
                 + ", load average at start {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())),
    ]


def _commit() -> str:
    """The commit of timers measured, and whether timers/ differs from it."""
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s", "--",
                              "timers"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "timers"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"timers/ as of commit {sha[:90]}" + (
        " + uncommitted changes in timers/" if dirty else "")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: about a minute")
    parser.add_argument("--server", metavar="PATH", help="redis-server/valkey-server binary")
    parser.add_argument("--only", metavar="NAME", help=f"comma-separated: {', '.join(SCENARIOS)}")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help=f"listener concurrency (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--config", type=Path, default=REPO / "redis.conf")
    parser.add_argument("--output", type=Path, help="where to write the Markdown table")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                        help="before each scenario, wait up to this long for the machine to "
                             "be under 15%% busy (other processes skew the figures)")
    args = parser.parse_args(argv)
    if args.only:
        unknown = [n for n in args.only.split(",") if n not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario {', '.join(unknown)}; pick from {', '.join(SCENARIOS)}")
    return args


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if any(a.split("=")[0] in ("--against", "--peers") for a in given):
        from bench import compare  # a same-sitting comparison: its own options

        return compare.main(given)
    args = _parse(argv)
    names = args.only.split(",") if args.only else list(SCENARIOS)
    sizes = Sizes.quick_run() if args.quick else Sizes.full()
    everything = not args.only and not args.quick
    output = args.output or (REPO / "bench" / ("RESULTS.md" if everything
                                                else "RESULTS-partial.md"))
    signal.signal(signal.SIGTERM, _on_term)
    started = time.monotonic()
    results = Results()
    with tempfile.TemporaryDirectory(prefix="timers-bench-") as workdir, \
            EmbeddedServer(binary=args.server, config=args.config) as server:
        ctx = Context(server.url, sizes, args.concurrency, Path(workdir), results)
        try:
            settings = _settings(ctx, server.binary, sizes, args, names)
            print("\n".join(f"{k}: {v}" for k, v in settings), flush=True)
            for name in names:
                module = SCENARIOS[name]
                limit = float(module.budget(ctx))
                print(f"\n== {name} (hard limit {limit:.0f} s)", flush=True)
                if args.wait_idle > 0:
                    quiet, waited, busy = wait_for_quiet(args.wait_idle)
                    print(f"   machine {'quiet' if quiet else 'still busy'} ({busy:.0f}% busy)"
                          f" after waiting {waited:.0f} s", flush=True)
                t0 = time.monotonic()
                _run_one(name, module.run, ctx, limit)
                print(f"== {name} took {time.monotonic() - t0:.0f} s", flush=True)
        except KeyboardInterrupt:
            print("\ninterrupted: reporting what was measured", flush=True)
            results.note("the run was interrupted")
            settings = settings if "settings" in locals() else []
        finally:
            ctx.close()
    elapsed = time.monotonic() - started
    text = render(settings, results)
    print("\n" + text, flush=True)
    output.write_text(_keep_comparison(
        output,
        f"# timers benchmarks\n\n`python -m bench{' --quick' if args.quick else ''}"
        f"{' --only ' + args.only if args.only else ''}` took {elapsed / 60:.1f} min.\n\n"
        + text + "\n" + METHOD + "\n" + FINDINGS.read_text()))
    print(f"written to {output}")
    return 0


def _keep_comparison(output: Path, text: str) -> str:
    """``text`` with the same-sitting section ``bench.compare`` wrote into ``output`` kept."""
    from bench.compare import BEGIN, END, splice

    old = output.read_text() if output.exists() else ""
    start, end = old.find(BEGIN), old.find(END)
    if start < 0 or end < start:
        return text
    return splice(text, old[start + len(BEGIN):end].strip("\n"))


def _run_one(name: str, run: Callable[[Context], None], ctx: Context, limit: float) -> None:
    before = MachineSample.take(ctx.r)
    try:
        with hard_limit(limit, name):
            run(ctx)
    except ScenarioTimeout as exc:
        ctx.results.add(Row(name, "(scenario)", f"stopped: {exc}"))
    except Exception as exc:
        traceback.print_exc()
        ctx.results.add(Row(name, "(scenario)", f"failed: {type(exc).__name__}: {exc}"))
    finally:
        with contextlib.suppress(Exception):
            ctx.stop_listeners()
    with contextlib.suppress(Exception):
        others, busy = MachineSample.take(ctx.r).others_since(before)
        flag = " - figures may be disturbed" if others > 10 else ""
        ctx.results.note(f"{name}: other processes on the machine used {others:.0f}% of a core "
                         f"on average (the machine was {busy:.0f}% busy){flag}")


if __name__ == "__main__":
    sys.exit(main())
