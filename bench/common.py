"""What every scenario shares: sizes, the server, listener processes, deadlines, figures."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from timers import Timers, TimerSpec
from timers.scripts import SCRIPT_NAMES, source

REPO = Path(__file__).resolve().parent.parent
PREFIX = "bench"
NOOP = "noop"
"""The trivial task every listener child registers (``registry={"noop": noop}``)."""
BACKGROUND_TASK = "background.pending"
"""Task of the timers that only sit in the index, due an hour out; never fires in a run."""
HOUR = 3600.0
LOAD_CHUNK = 100_000
"""Timers per ``schedule_many`` call when bulk-loading (bounds the client's memory)."""


def args_100(i: int) -> dict[str, Any]:
    """Keyword args that are exactly 100 bytes as compact JSON, different for each ``i``."""
    return {"user_id": i, "text": "x" * (88 - len(str(i)))}


# -- sizes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; :meth:`quick` shrinks everything to about a minute."""

    quick: bool = False
    spread_n: int = 2_000
    spread_s: float = 10.0
    steady_rate: int = 1_000
    steady_s: float = 30.0
    background_n: int = 1_000_000
    sync_s: float = 5.0
    async_s: float = 5.0
    async_in_flight: int = 100
    many_n: int = 200_000
    fire_ns: tuple[int, ...] = (20_000, 100_000)
    memory_ns: tuple[int, ...] = (100_000, 1_000_000)
    idle_n: int = 1_000_000
    idle_s: float = 30.0

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def quick_run(cls) -> Sizes:
        return cls(
            quick=True, spread_n=1_000, spread_s=3.0, steady_s=4.0, background_n=100_000,
            sync_s=1.0, async_s=1.0, many_n=50_000, fire_ns=(20_000,),
            memory_ns=(100_000,), idle_n=100_000, idle_s=10.0,
        )


# -- results ----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table."""

    scenario: str
    figure: str
    result: str
    target: str = ""
    met: bool | None = None
    peer: str = ""
    others: str = ""
    """CPU other processes on the machine used while this was measured (% of one core)."""


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    load_probe: Callable[[], str] | None = None
    """Fills :attr:`Row.others` (set by :class:`Context`)."""

    def add(self, row: Row) -> Row:
        if not row.others and self.load_probe is not None:
            with contextlib.suppress(Exception):
                row.others = self.load_probe()
        self.rows.append(row)
        print(f"  {row.scenario} | {row.figure}: {row.result}"
              + (f"   [target {row.target}: {_met_text(row.met)}]" if row.target else ""),
              flush=True)
        return row

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)


def _met_text(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "-"}[met]


def render(settings: Sequence[tuple[str, str]], results: Results) -> str:
    """The settings, the table and the notes, as Markdown (also what is printed)."""
    lines = ["Settings:", ""]
    lines += [f"- {name}: {value}" for name, value in settings]
    header = ("Scenario", "Figure", "Result", "Target", "Met", "Best peer measured",
              "Others' CPU")
    table = [header] + [
        (r.scenario, r.figure, r.result, r.target or "-", _met_text(r.met) if r.target else "-",
         r.peer or "-", r.others or "-")
        for r in results.rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    lines += ["", line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [line(row) for row in table[1:]]
    if results.notes:
        lines += ["", "Notes from this run:", ""]
        lines += [f"- {n}" for n in results.notes]
    return "\n".join(lines) + "\n"


# -- figures ----------------------------------------------------------------------------


def due_at(due_ms: int) -> datetime:
    return datetime.fromtimestamp(due_ms / 1000, tz=UTC)


def ms(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def count(value: float) -> str:
    return f"{value:,.0f}"


def shares(sources: Sequence[str]) -> str:
    """E.g. ``event 12%, sweep 88%`` for the paths timers fired by."""
    if not sources:
        return "n/a"
    counts = Counter(sources)
    return ", ".join(f"{name} {100 * counts[name] / len(sources):.0f}%"
                     for name in ("event", "sweep", "recovered") if counts[name])


# -- deadlines --------------------------------------------------------------------------


class ScenarioTimeout(Exception):
    """A scenario ran past its hard limit (its soft deadlines should have ended it)."""


@contextlib.contextmanager
def hard_limit(seconds: float, name: str) -> Iterator[None]:
    """Raise :class:`ScenarioTimeout` in the main thread after ``seconds``."""

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise ScenarioTimeout(f"{name} ran past its hard limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.end


def wait_until(predicate: Callable[[], bool], seconds: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true (True) or ``seconds`` pass (False)."""
    deadline = Deadline(seconds)
    while True:
        if predicate():
            return True
        if deadline.passed():
            return False
        time.sleep(min(interval, deadline.left()))


# -- the server -------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSample:
    """Counters read from the server: CPU seconds and calls per command."""

    at: float
    cpu_s: float
    calls: dict[str, int]
    usec: dict[str, int]
    children_cpu_s: float = 0.0
    """CPU of the server's forks (AOF rewrites)."""

    @classmethod
    def take(cls, r: redis.Redis) -> ServerSample:
        info = r.info("all")
        calls, usec = {}, {}
        for key, value in info.items():
            if key.startswith("cmdstat_") and isinstance(value, dict):
                name = key[len("cmdstat_"):]
                calls[name] = int(value["calls"])
                usec[name] = int(value["usec"])
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        children = float(info.get("used_cpu_user_children", 0)) + float(
            info.get("used_cpu_sys_children", 0))
        return cls(time.monotonic(), cpu, calls, usec, children)

    def calls_since(
        self, earlier: ServerSample, exclude: Sequence[str] = ("info",)
    ) -> dict[str, int]:
        """Calls per command between two samples, leaving out our own measuring ones."""
        out = {}
        for name, n in self.calls.items():
            delta = n - earlier.calls.get(name, 0)
            if delta and name not in exclude:
                out[name] = delta
        return out

    def usec_since(self, earlier: ServerSample, name: str) -> int:
        return self.usec.get(name, 0) - earlier.usec.get(name, 0)


def script_names() -> dict[str, str]:
    """SHA1 of each of timers' Lua scripts -> its name, to name EVALSHA calls."""
    return {hashlib.sha1(source(name).encode(), usedforsecurity=False).hexdigest(): name
            for name in SCRIPT_NAMES}


_MONITOR_LINE = re.compile(r'^\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]*)"(?: "([^"]*)")?')


class CommandMonitor:
    """Counts the commands clients send, read from MONITOR in a thread.

    Commands that scripts call (client ``lua``) are left out: INFO commandstats counts
    them too, and they are not traffic. So are ``ignore`` (our own measuring commands).
    EVALSHA calls are named after the timers script they run, e.g. ``evalsha claim``.
    """

    def __init__(self, host: str, port: int, ignore: Sequence[str] = ("info",)) -> None:
        self.ignore = {name.lower() for name in ignore}
        self.counts: Counter[str] = Counter()
        self._scripts = script_names()
        self._sock = socket.create_connection((host, port), timeout=5)
        self._sock.sendall(b"MONITOR\r\n")
        self._file = self._sock.makefile("rb")
        if not self._file.readline().startswith(b"+OK"):
            raise RuntimeError("MONITOR refused")
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._read, name="bench-monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in self._file:
                match = _MONITOR_LINE.match(raw.decode("utf-8", "replace"))
                if not match or match.group(1) == "lua":
                    continue
                name = match.group(2).lower()
                if name in self.ignore:
                    continue
                if name == "evalsha" and match.group(3):
                    name += " " + self._scripts.get(match.group(3), match.group(3)[:8])
                self.counts[name] += 1

    def stop(self) -> Counter[str]:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        return self.counts


@dataclass(frozen=True)
class MachineSample:
    """CPU seconds the whole machine, this process (and its reaped children) and the
    server have used: what is left over is other processes sharing the machine."""

    at: float
    busy_s: float
    own_s: float
    server_s: float

    @classmethod
    def take(cls, r: redis.Redis) -> MachineSample:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
        t = os.times()
        server = ServerSample.take(r)
        return cls(time.monotonic(), busy, t.user + t.system + t.children_user
                   + t.children_system, server.cpu_s + server.children_cpu_s)

    def others_since(self, earlier: MachineSample) -> tuple[float, float]:
        """(share of one core used by other processes, share of all cores busy), in %."""
        wall = max(self.at - earlier.at, 1e-9)
        busy = self.busy_s - earlier.busy_s
        others = busy - (self.own_s - earlier.own_s) - (self.server_s - earlier.server_s)
        return max(0.0, 100 * others / wall), 100 * busy / wall / (os.cpu_count() or 1)


def machine_busy(seconds: float = 1.0) -> float:
    """How busy all cores were over the next ``seconds``, in %."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]), idle

    total0, idle0 = read()
    time.sleep(seconds)
    total1, idle1 = read()
    return 100 * (1 - (idle1 - idle0) / max(total1 - total0, 1))


def wait_for_quiet(limit_s: float, busy_pct: float = 15.0) -> tuple[bool, float, float]:
    """Wait up to ``limit_s`` for the machine to be under ``busy_pct`` busy for a second.

    Returns (quiet, seconds waited, last busy %): on a shared machine other processes
    compete with the server and the listeners for the cores.
    """
    started = time.monotonic()
    busy = machine_busy()
    while busy >= busy_pct and time.monotonic() - started < limit_s:
        busy = machine_busy()
    return busy < busy_pct, time.monotonic() - started, busy


def server_label(r: redis.Redis) -> str:
    info = r.info("server")
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']}"
    name = str(info.get("server_name", "redis")).capitalize()
    return f"{name} {info['redis_version']}"


def config_value(r: redis.Redis, name: str) -> str:
    reply = r.config_get(name)
    return str(next(iter(reply.values()), ""))


# -- listener processes -----------------------------------------------------------------


@dataclass
class ListenerResult:
    """What a listener child reported: one tuple per run, and its CPU time."""

    fired: list[tuple[int, float, str, bool]]
    cpu_s: float
    """CPU seconds the child used from ready to exit (user + system, all threads)."""
    finished: bool
    """It stopped on its own (got ``expect`` runs), not because it was told to."""
    task_lateness: list[float] = field(default_factory=list)
    """Task's own ``time.time()`` at start minus the due ms in its args (where given)."""
    runs: list[tuple[str, int, float, float]] = field(default_factory=list)
    """Per run: timer id, the due ms its lateness counts from, start and end ms (Redis)."""

    @property
    def lateness_ms(self) -> list[float]:
        return sorted(started - due for due, started, _, _ in self.fired)

    @property
    def sources(self) -> list[str]:
        return [source for _, _, source, _ in self.fired]

    @property
    def failures(self) -> int:
        return sum(1 for *_, ok in self.fired if not ok)


def merge(results: Sequence[ListenerResult]) -> ListenerResult:
    fired = [f for r in results for f in r.fired]
    return ListenerResult(fired, sum(r.cpu_s for r in results), all(r.finished for r in results),
                          [x for r in results for x in r.task_lateness],
                          [x for r in results for x in r.runs])


class ListenerProc:
    """``python -m bench.listener`` in a child process: one Listener with the noop task."""

    def __init__(
        self, url: str, workdir: Path, name: str, *, concurrency: int, expect: int = 0,
        max_seconds: float = 600.0, metrics: bool = False,
    ) -> None:
        self.name = name
        self.out = workdir / f"{name}.json"
        self.ready_file = workdir / f"{name}.ready"
        self.log_path = workdir / f"{name}.log"
        for path in (self.out, self.ready_file):
            path.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "bench.listener", "--url", url, "--prefix", PREFIX,
            "--concurrency", str(concurrency), "--expect", str(expect),
            "--out", str(self.out), "--ready", str(self.ready_file),
            "--max-seconds", str(max_seconds), *(["--metrics"] if metrics else []),
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, seconds: float = 15.0) -> None:
        if not wait_until(lambda: self.ready_file.exists() or not self.alive(), seconds):
            raise RuntimeError(f"listener {self.name} not ready after {seconds:.0f} s"
                               f"{self.log_tail()}")
        if not self.ready_file.exists():
            raise RuntimeError(f"listener {self.name} exited at start{self.log_tail()}")

    def wait_exit(self, seconds: float) -> bool:
        try:
            self.process.wait(timeout=max(seconds, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM (the child stops, drains and writes what it has), then SIGKILL."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            if not self.wait_exit(grace):
                self.process.kill()
                self.process.wait()

    def result(self) -> ListenerResult | None:
        """Stop the child if it still runs and read its report (None if it wrote none)."""
        self.stop()
        try:
            data = json.loads(self.out.read_text())
        except (OSError, ValueError):
            return None
        fired = [(int(d), float(s), str(src), bool(ok)) for d, s, src, ok in data["fired"]]
        runs = [(str(i), int(d), float(s), float(e)) for i, d, s, e in data.get("runs", [])]
        return ListenerResult(fired, float(data["cpu_s"]), bool(data["finished"]),
                              [float(x) for x in data.get("task_lateness", [])], runs)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return ("; log:\n    " + "\n    ".join(text)) if text else ""


# -- the context every scenario gets ----------------------------------------------------


class Context:
    """The server connection, the sizes, the result table and the children to clean up."""

    def __init__(
        self, url: str, sizes: Sizes, concurrency: int, workdir: Path, results: Results,
    ) -> None:
        self.url = url
        self.sizes = sizes
        self.concurrency = concurrency
        self.workdir = workdir
        self.results = results
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self._children: list[ListenerProc] = []
        self._names = 0
        self._mark: MachineSample | None = None
        results.load_probe = self._others_since_mark

    def mark(self) -> None:
        """A measurement starts: rows added from now on show the CPU other processes used."""
        self._mark = MachineSample.take(self.r)

    def _others_since_mark(self) -> str:
        if self._mark is None:
            return ""
        others, _ = MachineSample.take(self.r).others_since(self._mark)
        return f"{others:.0f}%"

    # server state

    def fresh_db(self, *, aof: bool = True) -> None:
        """No listeners, an empty database, counters reset, AOF on or off (and settled)."""
        self.stop_listeners()
        self.r.flushall()
        self.set_aof(aof)
        self.r.config_resetstat()
        self.mark()

    def set_aof(self, on: bool) -> None:
        if config_value(self.r, "appendonly") != ("yes" if on else "no"):
            self.r.config_set("appendonly", "yes" if on else "no")
        self.wait_aof_settled()

    def wait_aof_settled(self, seconds: float = 180.0) -> None:
        """Wait for any AOF rewrite (a fork writing the whole dataset) to end."""

        def settled() -> bool:
            info = self.r.info("persistence")
            return not int(info.get("aof_rewrite_in_progress", 0)) and not int(
                info.get("aof_rewrite_scheduled", 0))

        if not wait_until(settled, seconds, 0.2):
            self.results.note(f"an AOF rewrite was still running after {seconds:.0f} s")

    def monitor(self) -> CommandMonitor:
        kwargs = self.r.connection_pool.connection_kwargs
        return CommandMonitor(str(kwargs.get("host", "127.0.0.1")), int(kwargs.get("port", 6379)))

    def redis_now_ms(self) -> float:
        sec, usec = self.r.time()
        return sec * 1000 + usec / 1000

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def wait_pending_below(self, n: int, seconds: float) -> bool:
        return wait_until(lambda: int(self.r.zcard(f"{PREFIX}|due")) <= n, seconds, 0.1)

    def fired_counter(self) -> int:
        return int(self.r.hget(f"{PREFIX}|stats", "fired") or 0)

    # producers

    def timers(self) -> Timers:
        return Timers(self.url, prefix=PREFIX)

    def bulk_load(
        self, n: int, *, task: str = BACKGROUND_TASK, in_: float = HOUR,
        args: Callable[[int], Any] = args_100, deadline: Deadline | None = None,
    ) -> tuple[int, float]:
        """Schedule ``n`` timers with ``schedule_many`` in chunks; (scheduled, seconds)."""
        done = 0
        started = time.perf_counter()
        with self.timers() as t:
            while done < n and not (deadline and deadline.passed()):
                size = min(LOAD_CHUNK, n - done)
                t.schedule_many([TimerSpec(task, args(done + i), in_=in_) for i in range(size)])
                done += size
        return done, time.perf_counter() - started

    # listeners

    def listener(self, *, expect: int = 0, max_seconds: float = 600.0,
                 metrics: bool = False) -> ListenerProc:
        """Start a listener child and wait until it is subscribed."""
        self._names += 1
        proc = ListenerProc(
            self.url, self.workdir, f"listener-{self._names}", concurrency=self.concurrency,
            expect=expect, max_seconds=max_seconds, metrics=metrics,
        )
        self._children.append(proc)
        proc.wait_ready()
        return proc

    def stop_listeners(self) -> None:
        for proc in self._children:
            with contextlib.suppress(Exception):
                proc.stop(grace=5.0)
        self._children.clear()

    def close(self) -> None:
        self.stop_listeners()
        with contextlib.suppress(Exception):
            self.r.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
