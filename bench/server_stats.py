"""Figures read from the server and the machine: CPU, calls per command, load."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from timers.store.lua_source import script_library, source
from timers.store.script_manifest import SCRIPT_NAMES

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
    """SHA1 of each of timers' Lua scripts, and its function name in the library -> the
    script's name, to name EVALSHA and FCALL calls."""
    library = script_library()[0]
    return {**{hashlib.sha1(source(name).encode(), usedforsecurity=False).hexdigest(): name
               for name in SCRIPT_NAMES},
            **{f"{library}_{name}": name for name in SCRIPT_NAMES}}


_MONITOR_LINE = re.compile(r'^\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]*)"(?: "([^"]*)")?')


class CommandMonitor:
    """Counts the commands clients send, read from MONITOR in a thread.

    Commands that scripts call (client ``lua``) are left out: INFO commandstats counts
    them too, and they are not traffic. So are ``ignore`` (our own measuring commands).
    Script calls are named after the timers script they run, e.g. ``fcall claim``.
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
                if name in ("evalsha", "fcall") and match.group(3):
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
