"""Same-sitting comparison: ``python -m bench.compare [--against REV] [--peers] …``
(also ``python -m bench --against REV``).

This machine's speed swings about 2x between days, so only figures taken in one sitting,
the sides alternating, say whether a change made things faster. This tool:

- installs REV (``git archive`` of that commit) into its own venv, with the uvloop and
  hiredis this venv has (:data:`SPEED_PACKAGES`), cached under
  ``/tmp/timers-bench-rev-<sha>``; the working tree runs in the current venv;
- with ``--peers``, installs Huey and Celery into ``/tmp/timers-bench-peers/venv`` and,
  when ``node`` and ``npm`` are on PATH, BullMQ into ``/tmp/timers-bench-bullmq`` (none of
  them is a dependency of the project);
- starts one server with the repository's redis.conf (and a second, plain one the tasks
  RPUSH to), then runs each scenario on a flushed database, **every side in turn, scenario
  by scenario, ``--rounds`` times** (the order of the sides turns each round), each side a
  subprocess with its own interpreter (``bench/side.py``, ``bench/peer_side.py``,
  ``bench/bullmq_side.cjs``), so REV's code is imported from REV's venv;
- prints, per figure, the median and the spread (min-max) of each side and the ratio of
  the working tree to each other side (new/old, timers/peer), the load average and the
  PING round trip measured before each run, and splices the table into ``bench/RESULTS.md``
  (between the markers of the "Same sitting" section; the rest of the file is kept);
- with ``--peers``, also measures the floor under the fires in the same rounds: the
  bench's task alone, with nothing of a task library around it (``redis-py alone``: the
  same ``push``/``apush`` from 32 threads / 50 coroutines; ``ioredis alone``: BullMQ's
  processor's RPUSH from 50 loops), and says what each worker spends of its own per fire
  (its CPU per fire less its task's);
- runs the ``async def`` fires with 50 runs at once on every side (the listener's
  ``concurrency``, BullMQ's worker ``concurrency``), the sync fires with each library's
  default (32 threads for a listener);
- with ``--by-script``, runs one more round in which the server logs every command
  (SLOWLOG, threshold 0) and says, per operation and side, Redis's time in each script
  (BullMQ's named from the scripts its client defines) and command, and each side's Redis
  CPU for a whole life: one ``single`` call plus one fire (that round is left out of the
  table: logging costs the server time);
- with ``--fail-below R``, exits 1 when a gated figure of the working tree is below R times
  REV's (for a figure where lower is better, when it is above 1/R times REV's).

Every loop is bounded in count and time, and all traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "RESULTS.md"
BEGIN = "<!-- same-sitting comparison: written by python -m bench.compare -->"
END = "<!-- end of the same-sitting comparison -->"
WORKING_TREE = "working tree"
REDIS_PY_ALONE = "redis-py alone"
"""The fires' Python task with nothing of timers around it (the floor of a Python worker)."""
IOREDIS_ALONE = "ioredis alone"
"""BullMQ's processor's RPUSH with nothing of BullMQ around it (the floor of its worker)."""
FLOORS = {WORKING_TREE: REDIS_PY_ALONE, "bullmq": IOREDIS_ALONE}
"""Whose floor each side's fires stand on: a Python listener's task is redis-py's call."""
BARE = "script call alone"
"""The floor under ``AsyncTimers.schedule`` and ``schedule()``: the same script call by a
plain ``redis.asyncio`` client, as many in flight, or a plain ``redis.Redis`` client, one
after another."""
INSIDE = "in scripts: "
"""Names a command a script ran (its time is part of the script's) in a ``--by-script``
breakdown."""
SLOWLOG_MAX = 400_000
"""Commands a ``--by-script`` run may log (a few hundred bytes each)."""
HISTORY_OFF = "history off"
TWO_LISTENERS = "2 listeners"
"""The working tree's fires shared by two listener processes (the runs at once split)."""
"""The working tree, its listener keeping no run history and no series."""
IN_FLIGHT = (1, 2, 5, 10)
"""``AsyncTimers.schedule`` awaited one at a time (``async1``), and so many in flight."""
BATCHES = (10, 100, 1_000, 10_000)
"""``schedule_many`` of so many timers a call, sync (``many10`` …) and async (``amany10`` …)."""
SCENARIOS = ("single", "bulk", *(f"many{b}" for b in BATCHES), *(f"amany{b}" for b in BATCHES),
             *(f"async{k}" for k in IN_FLIGHT), "async", "fire_sync", "fire_async")


# -- figures, spreads, ratios (pure) ----------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One line of the table: a value (``key``) that a scenario's sides report."""

    scenario: str
    label: str
    key: str
    higher_is_better: bool = True
    gated: bool = True
    """Counts for ``--fail-below`` (CPU-per-operation figures are shown, not gated)."""


FIGURES = (
    Figure("single", "single sync schedule() calls, /s", "rate"),
    Figure("single", "  producer CPU per call, us", "client_cpu_us", False, False),
    Figure("single", "  Redis CPU per call, us", "server_cpu_us", False, False),
    Figure("bulk", "schedule_many (BullMQ addBulk), timers/s", "rate"),
    Figure("bulk", "  producer CPU per timer, us", "client_cpu_us", False, False),
    Figure("bulk", "  Redis CPU per timer, us", "server_cpu_us", False, False),
    *(f for b in BATCHES for f in (
        Figure(f"many{b}", f"schedule_many (BullMQ addBulk) of {b:,} a call, timers/s", "rate"),
        Figure(f"many{b}", "  producer CPU per timer, us", "client_cpu_us", False, False),
        Figure(f"many{b}", "  Redis CPU per timer, us", "server_cpu_us", False, False))),
    *(f for b in BATCHES for f in (
        Figure(f"amany{b}", f"AsyncTimers.schedule_many of {b:,} a call, timers/s", "rate"),
        Figure(f"amany{b}", "  producer CPU per timer, us", "client_cpu_us", False, False),
        Figure(f"amany{b}", "  Redis CPU per timer, us", "server_cpu_us", False, False))),
    *(f for k in IN_FLIGHT for f in (
        Figure(f"async{k}", "AsyncTimers.schedule awaited one at a time, /s" if k == 1
               else f"AsyncTimers, {k} in flight, /s", "rate"),
        Figure(f"async{k}", "  latency of a call, p50, us", "p50_us", False, k == 1),
        Figure(f"async{k}", "  latency of a call, p99, us", "p99_us", False, False),
        Figure(f"async{k}", "  producer CPU per call, us", "client_cpu_us", False, False))),
    Figure("async", "AsyncTimers, 100 in flight, /s", "rate"),
    Figure("async", "  producer CPU per call, us", "client_cpu_us", False, False),
    Figure("async", "  Redis CPU per call, us", "server_cpu_us", False, False),
    Figure("fire_sync", "N due at once, sync task, fires/s", "rate"),
    Figure("fire_sync", "  first start after the due time, ms", "first_ms", False),
    Figure("fire_sync", "  worker CPU per fire, us", "worker_cpu_us", False, False),
    Figure("fire_sync", "  Redis CPU per fire, us", "server_cpu_us", False, False),
    Figure("fire_async", "N due at once, async task (50 at once), fires/s", "rate"),
    Figure("fire_async", "  first start after the due time, ms", "first_ms", False),
    Figure("fire_async", "  worker CPU per fire, us", "worker_cpu_us", False, False),
    Figure("fire_async", "  Redis CPU per fire, us", "server_cpu_us", False, False),
)


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread | None:
        got = sorted(values)
        if not got:
            return None
        return cls(statistics.median(got), got[0], got[-1], len(got))

    def text(self) -> str:
        if self.n == 1:
            return number(self.median)
        return f"{number(self.median)} ({number(self.low)}-{number(self.high)})"


def number(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def ratio(subject: Spread | None, other: Spread | None) -> float | None:
    """The subject's median over the other's (new/old, timers/peer), or None."""
    if subject is None or other is None or other.median == 0:
        return None
    return subject.median / other.median


def fails(figure: Figure, value: float | None, threshold: float | None) -> bool:
    """Whether a ratio new/old breaks ``--fail-below``: below it where higher is better,
    above its inverse where lower is better; a figure not gated never fails."""
    if threshold is None or value is None or not figure.gated:
        return False
    if figure.higher_is_better:
        return value < threshold
    return value > 1 / threshold


@dataclass
class Run:
    """One subprocess: one side, one scenario, one round."""

    round: int
    scenario: str
    side: str
    figures: dict[str, float]
    load1: float
    ping_us: float
    at: str
    error: str = ""
    commands: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per operation: {command: (calls, usec of Redis time)} from INFO commandstats."""
    scripts: dict[str, tuple[float, float]] = field(default_factory=dict)
    """With ``--by-script``, per operation: {script or command: (calls, usec)} from the
    server's SLOWLOG (every command logged: its execution time, without its I/O)."""


def spreads(runs: Sequence[Run]) -> dict[tuple[str, str, str], Spread]:
    """{(scenario, side, key): the spread over rounds}."""
    values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for run in runs:
        if run.error:
            continue
        for key, value in run.figures.items():
            values[(run.scenario, run.side, key)].append(float(value))
    return {k: s for k, v in values.items() if (s := Spread.of(v)) is not None}


@dataclass
class Line:
    """One figure of the table, worked out."""

    figure: Figure
    cells: dict[str, Spread | None]
    ratios: dict[str, float | None]
    failed: bool


def table_lines(runs: Sequence[Run], sides: Sequence[str], subject: str,
                gate_against: str | None, threshold: float | None,
                figures: Sequence[Figure] = FIGURES) -> list[Line]:
    """Every figure some side reported: each side's spread, the subject's ratio to each
    other side, and whether it fails the threshold against ``gate_against``."""
    got = spreads(runs)
    lines = []
    for figure in figures:
        cells = {side: got.get((figure.scenario, side, figure.key)) for side in sides}
        if all(c is None for c in cells.values()):
            continue
        ratios = {side: ratio(cells[subject], cells[side]) for side in sides if side != subject}
        failed = gate_against is not None and fails(figure, ratios.get(gate_against), threshold)
        lines.append(Line(figure, cells, ratios, failed))
    return lines


def markdown(lines: Sequence[Line], sides: Sequence[str], subject: str) -> str:
    others = [s for s in sides if s != subject]
    header = ["figure", *sides, *(f"{subject} / {o}" for o in others)]
    rows = [header]
    for line in lines:
        cells = [line.figure.label.strip() if not line.figure.label.startswith(" ")
                 else "- " + line.figure.label.strip()]
        cells += [c.text() if c else "-" for c in (line.cells[s] for s in sides)]
        cells += [f"{r:.2f}x" if r is not None else "-" for r in
                  (line.ratios[o] for o in others)]
        if line.failed:
            cells[0] += " **(below threshold)**"
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def fmt(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [fmt(r) for r in rows[1:]]) + "\n"


def splice(document: str, section: str) -> str:
    """``document`` with its comparison section replaced by ``section`` (appended if it
    has none): the rest of RESULTS.md, written by ``python -m bench``, stays."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}\n"
    start, end = document.find(BEGIN), document.find(END)
    if start >= 0 and end > start:
        return document[:start] + block + document[end + len(END):].lstrip("\n")
    return document.rstrip("\n") + ("\n\n" if document.strip() else "") + block


# -- sides ------------------------------------------------------------------------------


@dataclass
class Side:
    """A way to run the scenarios: an interpreter, a driver and its arguments."""

    name: str
    command: list[str]
    cwd: Path
    env: dict[str, str]
    argv: dict[str, list[str]]
    """{scenario: the driver's arguments}, for the scenarios this side has."""


def timers_side(name: str, python: str, cwd: Path, url: str, sink: str, n: int,
                seconds: float, env: dict[str, str] | None = None) -> Side:
    base = ["--url", url]
    # the working tree's side imports this checkout's timers (whichever tree the venv's
    # editable install points at); REV's side only what its own venv holds
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if cwd == REPO:
        inherited["PYTHONPATH"] = str(REPO)
    return Side(name, [python, "-P", str(BENCH / "side.py")], cwd,
                {**inherited, **(env or {})}, {
        "single": ["single", *base, "--seconds", str(seconds)],
        "bulk": ["bulk", *base, "--n", str(n)],
        "async": ["async", *base, "--seconds", str(seconds)],
        **{f"async{k}": ["async", *base, "--seconds", str(seconds), "--in-flight", str(k)]
           for k in IN_FLIGHT},
        **{f"many{b}": ["bulk", *base, "--n", str(max(n, b)), "--batch", str(b),
                        "--seconds", str(seconds)] for b in BATCHES},
        **{f"amany{b}": ["bulk", *base, "--n", str(max(n, b)), "--batch", str(b),
                         "--seconds", str(seconds), "--aio"] for b in BATCHES},
        "fire_sync": ["fire", "--task", "push", *base, "--sink", sink, "--n", str(n)],
        "fire_async": ["fire", "--task", "apush", *base, "--sink", sink, "--n", str(n)],
    })


def python_peer(peer: str, python: str, url: str, sink: str, n: int, seconds: float) -> Side:
    return Side(peer, [python, "-P", str(BENCH / "peer_side.py"), peer],
                Path(tempfile.gettempdir()), dict(os.environ), {
                    "single": ["single", "--url", url, "--seconds", str(seconds)],
                    "fire_sync": ["fire", "--url", url, "--sink", sink, "--n", str(n)],
                })


def bullmq_side(folder: Path, url: str, sink: str, n: int, seconds: float) -> Side:
    env = dict(os.environ, NODE_PATH=str(folder / "node_modules"))
    return Side("bullmq", ["node", str(BENCH / "bullmq_side.cjs")], folder, env, {
        "single": ["single", url, "", str(n), str(seconds)],
        "bulk": ["bulk", url, "", str(n), str(seconds)],
        **{f"many{b}": ["batches", url, "", str(max(n, b)), str(seconds), str(b)]
           for b in BATCHES},
        "async": ["async", url, "", str(n), str(seconds)],
        "fire_async": ["fire", url, sink, str(n), str(seconds)],
    })


def bare_side(python: str, url: str, n: int, seconds: float) -> Side:
    """The floor under ``AsyncTimers.schedule`` and ``schedule()``: the same script call
    (prepared by the working tree) sent by a plain ``redis.asyncio`` client, as many in
    flight, and by a plain ``redis.Redis`` client one after another."""
    base = ["bare", "--url", url, "--n", str(n), "--seconds", str(seconds)]
    return Side(BARE, [python, "-P", str(BENCH / "side.py")], REPO,
                {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                | {"PYTHONPATH": str(REPO)},
                {"single": [*base, "--in-flight", "0"],
                 "async": [*base, "--in-flight", "100"],
                 **{f"async{k}": [*base, "--in-flight", str(k)] for k in IN_FLIGHT}})


def floor_sides(python: str, sink: str, n: int, bull: Path | None) -> list[Side]:
    """The task alone under the fires: the working tree's (redis-py) and, with node,
    BullMQ's (ioredis): the same calls, the same number at once, nothing around them."""
    base = ["--url", sink, "--sink", sink, "--n", str(n)]
    sides = [Side(REDIS_PY_ALONE, [python, "-P", str(BENCH / "side.py")], REPO,
                  {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                  | {"PYTHONPATH": str(REPO)}, {
                      "fire_sync": ["alone", "--task", "push", *base],
                      "fire_async": ["alone", "--task", "apush", *base]})]
    if bull is not None:
        sides.append(Side(IOREDIS_ALONE, ["node", str(BENCH / "bullmq_side.cjs")], bull,
                          dict(os.environ, NODE_PATH=str(bull / "node_modules")),
                          {"fire_async": ["alone", sink, sink, str(n)]}))
    return sides


def own_cpu_notes(runs: Sequence[Run]) -> list[str]:
    """Per fires scenario, what each worker spends of its own per fire: the median of its
    CPU per fire less the median of its floor's (the task alone), in the same rounds."""
    got = spreads(runs)
    notes = []
    for scenario in ("fire_sync", "fire_async"):
        parts = []
        for side, floor in FLOORS.items():
            worker = got.get((scenario, side, "worker_cpu_us"))
            task = got.get((scenario, floor, "worker_cpu_us"))
            if worker is None or task is None:
                continue
            parts.append(f"{side} {number(worker.median - task.median)} us of its own per fire "
                         f"({number(worker.median)} us in all, its task alone "
                         f"{number(task.median)} us)")
        if parts:
            notes.append(f"{scenario}: " + "; ".join(parts))
    return notes


def _run(argv: list[str], **kwargs: Any) -> None:
    print("  $ " + " ".join(argv), flush=True)
    subprocess.run(argv, check=True, **kwargs)


SPEED_PACKAGES = ("uvloop", "hiredis")
"""Optional packages the listener uses when installed: REV's venv gets the versions this
venv has, so both sides run on the same event loop and parser (REV's own extras may name
neither). Without it REV ran its ``async def`` fires on asyncio's loop and the working
tree on uvloop: a comparison of a commit with itself read 1.10x (bench/FINDINGS.md,
"A bias in the comparison: uvloop on one side only")."""


def speed_pins() -> list[str]:
    """``name==version`` of each of :data:`SPEED_PACKAGES` installed here."""
    pins = []
    for name in SPEED_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            pins.append(f"{name}=={metadata.version(name)}")
    return pins


def rev_install(python: Path, src: Path) -> list[str]:
    """The command that installs REV's ``src`` into its venv (``python``), with this venv's
    :data:`SPEED_PACKAGES`."""
    return [str(python), "-m", "pip", "install", "-q", str(src), *speed_pins()]


def rev_python(rev: str) -> tuple[str, Path, str]:
    """REV installed in its own venv (cached), with this venv's :data:`SPEED_PACKAGES`:
    (its python, its source tree, its label)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    label = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %cs", sha],
                           capture_output=True, text=True, check=True).stdout.strip()
    root = Path(tempfile.gettempdir()) / f"timers-bench-rev-{sha[:12]}"
    python, src, marker = root / "venv" / "bin" / "python", root / "src", root / "installed"
    pins = speed_pins()
    installed = " ".join([sha, *pins]) + "\n"
    if not marker.exists() or marker.read_text() != installed:
        print(f"installing {label} into {root}", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        _run([sys.executable, "-m", "venv", str(root / "venv")])
        _run(rev_install(python, src))
        marker.write_text(installed)
    return str(python), src, label.split()[0]


PEERS_ROOT = Path(tempfile.gettempdir()) / "timers-bench-peers"
BULLMQ_ROOT = Path(tempfile.gettempdir()) / "timers-bench-bullmq"


def peers_python() -> str:
    """Huey, Celery (Redis broker) and redis-py in their own venv (cached)."""
    python, marker = PEERS_ROOT / "venv" / "bin" / "python", PEERS_ROOT / "installed"
    if not marker.exists():
        PEERS_ROOT.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(PEERS_ROOT / "venv")])
        _run([str(python), "-m", "pip", "install", "-q", "huey", "celery[redis]", "redis"])
        marker.write_text("huey celery redis\n")
    return str(python)


def bullmq_folder() -> Path | None:
    """BullMQ and ioredis installed by npm into their own folder, or None without node."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return None
    if not (BULLMQ_ROOT / "node_modules" / "bullmq").exists() or not (
            BULLMQ_ROOT / "node_modules" / "ioredis").exists():
        BULLMQ_ROOT.mkdir(parents=True, exist_ok=True)
        package = BULLMQ_ROOT / "package.json"
        if not package.exists():
            package.write_text('{"name": "timers-bench-bullmq", "private": true}\n')
        _run(["npm", "install", "--no-audit", "--no-fund", "bullmq", "ioredis"],
             cwd=BULLMQ_ROOT, stdout=subprocess.DEVNULL)
    return BULLMQ_ROOT


def peer_versions(python: str | None, folder: Path | None) -> str:
    parts = []
    if python:
        with contextlib.suppress(Exception):
            parts.append(subprocess.run(
                [python, "-c", "import huey, celery; print(f'Huey {huey.__version__}, "
                               "Celery {celery.__version__}')"],
                capture_output=True, text=True, check=True).stdout.strip())
    if folder:
        with contextlib.suppress(Exception):
            meta = json.loads((folder / "node_modules" / "bullmq" / "package.json").read_text())
            parts.append(f"BullMQ {meta['version']} (node {_node_version()})")
    return ", ".join(parts)


def _node_version() -> str:
    return subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()


# -- running ----------------------------------------------------------------------------


def budget(scenario: str, n: int, seconds: float) -> float:
    """Seconds a side may take for a scenario before it is stopped."""
    if scenario.startswith(("async", "many", "amany")):
        return seconds + 60 + n / 2_000  # (the specs, or the floor's calls, built first)
    return {"single": seconds + 60, "bulk": 60 + n / 1_000,
            "fire_sync": 120 + n / 100, "fire_async": 90 + n / 200}[scenario]


def slowlog_by_script(r: Any, raw: Any, names: dict[str, str],
                      n: float) -> dict[str, tuple[float, float]]:
    """A server's SLOWLOG (every command logged: threshold 0), per operation of ``n``:
    {script or command: (calls, usec)} (a script named from ``names``, {sha or function:
    name}, else ``evalsha <sha>``; a command a script ran, whose time is in the script's,
    named with :data:`INSIDE` first). ``r`` decodes replies, ``raw`` does not (the log
    holds binary arguments); logging stops first (reading it is not logged)."""
    r.config_set("slowlog-log-slower-than", -1)
    entries = raw.execute_command("SLOWLOG", "GET", -1)
    total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for entry in entries:
        usec = int(entry[2])
        args = [a.decode(errors="replace") if isinstance(a, bytes) else str(a)
                for a in entry[3]]
        what = args[0].lower() if args else "?"
        if what in ("evalsha", "evalsha_ro", "fcall", "fcall_ro") and len(args) > 1:
            what = names.get(args[1].lower(), names.get(args[1], f"{what} {args[1][:8]}"))
        elif what in ("eval", "eval_ro"):
            what = "eval (script sent whole)"
        if what in ("slowlog", "config", "info", "ping", "flushall"):
            continue
        if str(entry[4], errors="replace") in ("?:0", ""):  # run by a script: in its time
            what = INSIDE + what
        total[what][0] += 1
        total[what][1] += usec
    if len(entries) >= SLOWLOG_MAX:
        total["(log full: later commands not counted)"] = [0.0, 0.0]
    return {k: (c / n, u / n) for k, (c, u) in total.items()}


class Bench:
    """The servers, and one run of one side."""

    def __init__(self, broker: Any, sink: Any) -> None:
        import redis

        self.r = redis.Redis.from_url(broker.url, decode_responses=True)
        self.sink = redis.Redis.from_url(sink.url, decode_responses=True)
        self.raw = redis.Redis.from_url(broker.url)  # (the log holds binary arguments)
        self.by_script: dict[str, str] | None = None
        """With ``--by-script``: {sha or function: script name}; each run logs every
        command (SLOWLOG) and is then a breakdown run, left out of the table."""

    def fresh(self) -> None:
        self.r.flushall()
        self.sink.flushall()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = self.r.info("persistence")
            if not int(info.get("aof_rewrite_in_progress", 0)) and not int(
                    info.get("aof_rewrite_scheduled", 0)):
                break
            time.sleep(0.2)
        self.r.config_resetstat()
        if self.by_script is not None:
            self.r.config_set("slowlog-log-slower-than", 0)
            self.r.config_set("slowlog-max-len", SLOWLOG_MAX)
            self.r.slowlog_reset()

    def quiet_log(self) -> None:
        """Stop logging every command (the server's default threshold again)."""
        self.r.config_set("slowlog-log-slower-than", 10_000)
        self.r.config_set("slowlog-max-len", 128)
        self.r.slowlog_reset()

    def logged(self, n: float) -> dict[str, tuple[float, float]]:
        """The SLOWLOG since :meth:`fresh`, per operation (:func:`slowlog_by_script`)."""
        return slowlog_by_script(self.r, self.raw, self.by_script or {}, n)

    def ping_us(self, n: int = 500) -> float:
        start = time.perf_counter()
        for _ in range(n):
            self.r.ping()
        return (time.perf_counter() - start) / n * 1e6

    def server_cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def commandstats(self) -> dict[str, tuple[int, float]]:
        return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
                for name, v in self.r.info("commandstats").items()}

    def run(self, side: Side, scenario: str, round_: int, n: int, seconds: float) -> Run:
        self.fresh()
        load1, ping = os.getloadavg()[0], self.ping_us()
        at = datetime.now(UTC).strftime("%H:%M:%S")
        before_cpu, before_cmd = self.server_cpu(), self.commandstats()
        argv = side.command + side.argv[scenario]
        error, figures = "", {}
        try:
            done = subprocess.run(argv, cwd=side.cwd, env=side.env, capture_output=True,
                                  text=True, timeout=budget(scenario, n, seconds))
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            if done.returncode != 0 or not last.startswith("{"):
                error = f"exit {done.returncode}: {(done.stderr or done.stdout)[-300:]}"
            else:
                figures = {k: float(v) for k, v in json.loads(last).items()}
        except subprocess.TimeoutExpired:
            error = f"stopped after {budget(scenario, n, seconds):.0f} s"
        if figures and figures.get("complete", 1.0) < 1.0:
            error = f"only {figures.get('n', 0):.0f} of {n} fired in time"
        if figures.get("late_enqueue_ms", 0.0) > 0:
            error = (f"the last timer was scheduled {figures['late_enqueue_ms']:.0f} ms after "
                     "the due time: the figures would measure the producer")
        done_n = max(figures.get("n", 0.0), 1.0)
        if "server_cpu_us" not in figures and figures and side.name not in FLOORS.values():
            figures["server_cpu_us"] = (self.server_cpu() - before_cpu) / done_n * 1e6
        after_cmd = self.commandstats()
        commands = {c: ((calls - before_cmd.get(c, (0, 0.0))[0]) / done_n,
                        (usec - before_cmd.get(c, (0, 0.0))[1]) / done_n)
                    for c, (calls, usec) in after_cmd.items()
                    if c not in ("info", "ping", "flushall", "config|resetstat", "config")}
        scripts = self.logged(done_n) if self.by_script is not None and figures else {}
        run = Run(round_, scenario, side.name, figures, load1, ping, at, error, commands,
                  scripts)
        shown = (f"{figures.get('rate', 0):,.0f}/s" if figures else error)
        extra = ", ".join(f"{k} {number(v)}" for k, v in figures.items()
                          if k not in ("rate", "n", "complete", "late_enqueue_ms"))
        print(f"  round {round_} {scenario:<10} {side.name:<14} {shown}  ({extra}; load "
              f"{load1:.2f}, PING {ping:.0f} us){' ' + error if error and figures else ''}",
              flush=True)
        return run


def sitting(bench: Bench, sides: Sequence[Side], scenarios: Sequence[str], rounds: int,
            n: int, seconds: float, deadline: float) -> list[Run]:
    """Every side in turn, scenario by scenario, ``rounds`` times; the order of the sides
    turns each round so neither always runs first on a warmer (or busier) machine."""
    runs: list[Run] = []
    try:
        _rounds(bench, sides, scenarios, rounds, n, seconds, deadline, runs)
    except KeyboardInterrupt:
        print("  interrupted: reporting what was measured", flush=True)
    return runs


def _rounds(bench: Bench, sides: Sequence[Side], scenarios: Sequence[str], rounds: int,
            n: int, seconds: float, deadline: float, runs: list[Run]) -> None:
    for round_ in range(1, rounds + 1):
        for scenario in scenarios:
            turn = [s for s in sides if scenario in s.argv]
            shift = (round_ - 1) % max(len(turn), 1)
            for side in turn[shift:] + turn[:shift]:
                if time.monotonic() > deadline:
                    print("  the time limit is reached: stopping with what was measured")
                    return
                runs.append(bench.run(side, scenario, round_, n, seconds))


def command_notes(runs: Sequence[Run], sides: Sequence[str]) -> list[str]:
    """Redis commands per operation (median over rounds) for the timers sides."""
    notes = []
    for scenario in SCENARIOS:
        for side in sides:
            mine = [r for r in runs if r.scenario == scenario and r.side == side and not r.error]
            if not mine:
                continue
            names = sorted({c for r in mine for c in r.commands})
            per = []
            for c in names:
                calls = statistics.median(r.commands.get(c, (0.0, 0.0))[0] for r in mine)
                usec = statistics.median(r.commands.get(c, (0.0, 0.0))[1] for r in mine)
                if calls >= 0.005:
                    per.append((usec, f"{c} {calls:.2f} calls {usec:.1f} us"))
            if per:
                notes.append(f"{scenario}, {side}: " + "; ".join(t for _, t in sorted(per)[::-1]))
    return notes


def script_notes(runs: Sequence[Run]) -> list[str]:
    """Per logged run: Redis's time per operation by script or command, largest first."""
    notes = []
    for r in runs:
        if r.error or not r.scripts:
            continue
        total = sum(u for name, (_, u) in r.scripts.items() if not name.startswith(INSIDE))
        parts = [f"{name} {calls:.2f} calls {usec:.1f} us"
                 for name, (calls, usec) in sorted(
                     r.scripts.items(), key=lambda kv: (kv[0].startswith(INSIDE), -kv[1][1]))
                 if calls >= 0.005 or usec >= 0.05]
        notes.append(f"{r.scenario}, {r.side}: {total:.1f} us in all: " + "; ".join(parts))
    return notes


LIFE = (("single", "fire_async"), ("single", "fire_sync"))
"""A timer's (a job's) life: scheduled by one call, then fired (sync or ``async def``)."""


def life_notes(runs: Sequence[Run]) -> list[str]:
    """Per side: Redis CPU per call of one ``schedule`` plus per fire (medians), the whole
    life of one timer or job on the server."""
    got = spreads(runs)
    notes = []
    sides = sorted({r.side for r in runs})
    for schedule, fire in LIFE:
        parts = []
        for side in sides:
            a = got.get((schedule, side, "server_cpu_us"))
            b = got.get((fire, side, "server_cpu_us"))
            if a is not None and b is not None:
                parts.append(f"{side} {number(a.median + b.median)} us ({number(a.median)} + "
                             f"{number(b.median)})")
        if parts:
            notes.append(f"Redis CPU per life, {schedule} + {fire}: " + "; ".join(parts))
    return notes


def bullmq_scripts(folder: Path, url: str) -> dict[str, str]:
    """{sha: name} of BullMQ's scripts, as its ioredis client defines them."""
    done = subprocess.run(["node", str(BENCH / "bullmq_side.cjs"), "scripts", url],
                          cwd=folder, env=dict(os.environ, NODE_PATH=str(folder / "node_modules")),
                          capture_output=True, text=True, timeout=60)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    return {sha: f"bullmq {name}" for sha, name in json.loads(last).items()}


def runs_text(runs: Sequence[Run]) -> list[str]:
    out = []
    for r in runs:
        value = (f"{r.figures['rate']:,.0f}/s" if "rate" in r.figures else "-")
        first = (f", first start {r.figures['first_ms']:.1f} ms" if "first_ms" in r.figures
                 else "")
        out.append(f"round {r.round}, {r.scenario}, {r.side}: {value}{first}; at {r.at} UTC, "
                   f"load {r.load1:.2f}, PING {r.ping_us:.0f} us"
                   + (f" - {r.error}" if r.error else ""))
    return out


# -- the command ------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", metavar="REV", help="an earlier commit (any git revision)")
    p.add_argument("--peers", action="store_true", help="Huey, Celery and (with node) BullMQ")
    p.add_argument("--bare", action="store_true",
                   help="also the floor under schedule() and AsyncTimers.schedule: the same "
                        "script call by a plain redis-py client (in the single and async "
                        "scenarios)")
    p.add_argument("--two-listeners", action="store_true",
                   help="also the working tree's fires shared by two listener processes "
                        "(the runs at once split between them)")
    p.add_argument("--history-off", action="store_true",
                   help="also the working tree with its listener keeping no run history "
                        "and no series (the cost of both, same sitting)")
    p.add_argument("--by-script", action="store_true",
                   help="after the rounds, one more in which the server logs every command "
                        "(SLOWLOG): Redis's time per operation by script and command, for "
                        "every side (that round is left out of the table)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fail-below", type=float, metavar="RATIO",
                   help="exit 1 when a gated figure new/old is below RATIO (e.g. 0.97)")
    p.add_argument("--only", metavar="NAMES", help=f"comma-separated: {', '.join(SCENARIOS)}")
    p.add_argument("--n", type=int, default=20_000, help="timers for bulk and fire (20,000)")
    p.add_argument("--seconds", type=float, default=3.0, help="for single and async (3)")
    p.add_argument("--server", metavar="PATH", help="redis-server/valkey-server binary")
    p.add_argument("--config", type=Path, default=REPO / "redis.conf")
    p.add_argument("--max-minutes", type=float, default=20.0,
                   help="start no run after this long (default 20)")
    p.add_argument("--output", type=Path, default=RESULTS,
                   help="splice the table into this file (default bench/RESULTS.md)")
    p.add_argument("--no-write", action="store_true", help="print only")
    opts = p.parse_args(argv)
    if not (opts.against or opts.peers or opts.history_off or opts.bare
            or opts.two_listeners):
        p.error("nothing to compare with: give --against REV, --peers, --bare, "
                "--two-listeners and/or --history-off")
    if opts.only:
        unknown = [s for s in opts.only.split(",") if s not in SCENARIOS]
        if unknown:
            p.error(f"unknown scenario {', '.join(unknown)}; pick from {', '.join(SCENARIOS)}")
    if opts.rounds < 1:
        p.error("--rounds must be at least 1")
    return opts


def _head() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %cs", "--", "timers"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "timers"],
                           capture_output=True, text=True).stdout.strip()
    return out + (" + uncommitted changes in timers/" if dirty else "")


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse(argv)
    from bench.server_stats import script_names
    from timers.dev.server import EmbeddedServer

    signal.signal(signal.SIGTERM, _on_term)

    scenarios = opts.only.split(",") if opts.only else list(SCENARIOS)
    started, began = time.monotonic(), datetime.now(UTC)
    load_start = os.getloadavg()
    rev = rev_python(opts.against) if opts.against else None
    py_peers = peers_python() if opts.peers else None
    bull = bullmq_folder() if opts.peers else None
    with EmbeddedServer(binary=opts.server, config=opts.config) as broker, \
            EmbeddedServer(binary=opts.server) as sink:
        bench = Bench(broker, sink)
        sides: list[Side] = []
        if rev is not None:
            sides.append(timers_side(rev[2], rev[0], rev[1], broker.url, sink.url, opts.n,
                                     opts.seconds))
        sides.append(timers_side(WORKING_TREE, sys.executable, REPO, broker.url, sink.url,
                                 opts.n, opts.seconds))
        if opts.bare:
            sides.append(bare_side(sys.executable, broker.url, opts.n, opts.seconds))
        if opts.history_off:
            sides.append(timers_side(HISTORY_OFF, sys.executable, REPO, broker.url, sink.url,
                                     opts.n, opts.seconds, {"BENCH_HISTORY": "off"}))
        if opts.two_listeners:
            two = timers_side(TWO_LISTENERS, sys.executable, REPO, broker.url, sink.url,
                              opts.n, opts.seconds, {"BENCH_LISTENERS": "2"})
            sides.append(Side(two.name, two.command, two.cwd, two.env,
                              {k: v for k, v in two.argv.items() if k.startswith("fire")}))
        if py_peers:
            sides += [python_peer(p, py_peers, broker.url, sink.url, opts.n, opts.seconds)
                      for p in ("huey", "celery")]
        if bull:
            sides.append(bullmq_side(bull, broker.url, sink.url, opts.n, opts.seconds))
        if opts.peers:
            sides += floor_sides(sys.executable, sink.url, opts.n, bull)
        server = f"{broker.version} ({broker.binary}), config {opts.config.name}"
        print(f"sides: {', '.join(s.name for s in sides)}; server {server}", flush=True)
        runs = sitting(bench, sides, scenarios, opts.rounds, opts.n, opts.seconds,
                       started + opts.max_minutes * 60)
        if opts.by_script:
            bench.by_script = script_names() | (bullmq_scripts(bull, broker.url) if bull
                                                else {})
            print("one more round, every command logged (--by-script)", flush=True)
            breakdown = sitting(bench, sides, scenarios, 1, opts.n, opts.seconds,
                                started + (opts.max_minutes + 10) * 60)
            bench.quiet_log()
            runs += [replace(r, round=0) for r in breakdown]
        bench.r.close()
        bench.sink.close()
        bench.raw.close()
    logged = [r for r in runs if r.round == 0]
    runs = [r for r in runs if r.round > 0]
    measured = {r.side for r in runs if not r.error}
    names = [s.name for s in sides if s.name in measured or s.name == WORKING_TREE]
    gate = rev[2] if rev else None
    lines = table_lines(runs, names, WORKING_TREE, gate, opts.fail_below)
    table = markdown(lines, names, WORKING_TREE)
    pings = Spread.of(r.ping_us for r in runs)
    loads = Spread.of(r.load1 for r in runs)
    settings = [
        ("command", "python -m bench.compare " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])),
        ("date", f"{began:%Y-%m-%d %H:%M} UTC, {(time.monotonic() - started) / 60:.1f} min; "
                 f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} "
                 f"{load_start[2]:.2f}"),
        ("working tree", "timers/ as of " + _head()),
        ("sides", ", ".join(names) + (f" ({peer_versions(py_peers, bull)})"
                                      if opts.peers else "")),
        ("server", server),
        ("sizes", f"N = {opts.n:,} for bulk and the fires, and at most for the batches of "
                  f"schedule_many; {opts.seconds:g} s for single, async and (at most) the "
                  f"batches; {opts.rounds} rounds, sides alternating scenario by scenario"),
        ("machine", f"{os.cpu_count()} cores, shared; load average (1 min) before each run "
                    f"{loads.text() if loads else '-'}; PING round trip before each run "
                    f"{pings.text() + ' us' if pings else '-'}"),
    ]
    failed = [line for line in lines if line.failed]
    text = "\n".join(f"- {k}: {v}" for k, v in settings) + "\n\n" + table
    text += ("\nEach cell: median (min-max) over the rounds. Ratios are of the medians, "
             f"{WORKING_TREE} over each other side; where lower is better (ms, us) a ratio "
             "under 1 is the working tree ahead.\n")
    if opts.fail_below is not None and gate:
        text += (f"\n--fail-below {opts.fail_below}: "
                 + (f"{len(failed)} figure(s) below: "
                    + ", ".join(f.figure.label.strip() for f in failed) if failed
                    else "every gated figure passes") + "\n")
    text += "\nEach run (load average and PING round trip taken just before it):\n\n"
    text += "\n".join(f"- {line}" for line in runs_text(runs)) + "\n"
    own = own_cpu_notes(runs)
    if own:
        text += ("\nWhat each worker spends of its own per fire (its CPU per fire less its "
                 "task's alone, medians):\n\n" + "\n".join(f"- {n}" for n in own) + "\n")
    notes = command_notes(runs, [n for n in names if n in (WORKING_TREE, HISTORY_OFF, gate)])
    if notes:
        text += "\nRedis commands per operation (INFO commandstats, median over rounds):\n\n"
        text += "\n".join(f"- {n}" for n in notes) + "\n"
    if logged:
        text += ("\nRedis's time per operation by script and command (one more round, every "
                 "command logged by SLOWLOG: execution time without I/O, so below the CPU "
                 "figures above; a fires run's log holds its setup too, the N timers "
                 "scheduled before the clock starts), and for each side the whole life "
                 "of a timer (the schedule's and the fire's Redis CPU above):\n\n")
        text += "\n".join(f"- {n}" for n in script_notes(logged) + life_notes(runs)) + "\n"
    print("\n" + text, flush=True)
    if not opts.no_write:
        section = "## Same sitting: the working tree against " + (
            ", ".join(n for n in names if n != WORKING_TREE)) + "\n\n" + text
        existing = opts.output.read_text() if opts.output.exists() else ""
        opts.output.write_text(splice(existing, section))
        print(f"written to {opts.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
