"""Listener processes of a fault scenario, and waiting for things with a deadline."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from bench.fault_tasks.ledger import LEDGER_ENV
from bench.faults.ledger import KILL_FLUSH_GRACE, Signal
from timers.model.keys import Keyspace

REPO = Path(__file__).resolve().parent.parent.parent
TASKS = "bench.fault_tasks"
EXPIRED_CHANNEL = Keyspace.expired_channel(0)
LISTENER_START_TIMEOUT = 20.0


class FaultError(RuntimeError):
    """A scenario could not go on (a deadline passed, a process died)."""


def wait_for(condition: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.02) -> Any:
    """Poll ``condition`` until it is truthy; :class:`FaultError` after ``timeout`` s.

    Errors from Redis count as "not yet": the server may be restarting, paused or full.
    """
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            value = condition()
            if value:
                return value
        if time.monotonic() > deadline:
            raise FaultError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL when this script dies, however it dies,
    so no listener outlives a run."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def child_pids(parent: int) -> list[int]:
    """The live processes whose parent is ``parent`` (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[1]) == parent and fields[0] != "Z":
                found.append(int(entry.name))
    return sorted(found)


class ListenerProcess:
    """``python -m timers listen`` in a child process, its output in a log file.

    With ``processes`` > 1 it is the ``--processes`` supervisor, in a session of its own so
    the bench can end whatever children it leaves (its process group)."""

    def __init__(self, url: str, ledger: Path, log_path: Path, *, lease: float = 2.0,
                 concurrency: int = 100, shutdown_timeout: float = 5.0,
                 tasks: str = TASKS, extra_env: Mapping[str, str] | None = None,
                 processes: int = 1, extra_args: Sequence[str] = ()) -> None:
        self.shutdown_timeout = shutdown_timeout
        self.log_path = log_path
        self.processes = processes
        command = [
            sys.executable, "-m", "timers", "listen", "--url", url, "--tasks", tasks,
            "--concurrency", str(concurrency), "--lease", str(lease),
            "--shutdown-timeout", str(shutdown_timeout), "--log-level", "info",
        ]
        if processes > 1:
            command += ["--processes", str(processes)]
        command += extra_args
        env = dict(os.environ)
        env.pop("TIMERS_REDIS_URL", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env[LEDGER_ENV] = str(ledger)
        env.update(extra_env or {})
        with log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                start_new_session=processes > 1,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, sig: signal.Signals) -> Signal:
        """Send ``sig`` and say which of this process's runs it cuts short."""
        at = time.time()
        self.process.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGSTOP):  # a stopped process ends nothing
            cutoff = at - KILL_FLUSH_GRACE
        else:
            cutoff = at + self.shutdown_timeout - 0.05
        return Signal(self.pid, sig.name, at, cutoff)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def last_words(self) -> str:
        """The last line of its log that says something went wrong (or its last line)."""
        lines = [line.strip() for line in self.log().splitlines() if line.strip()]
        said = next((line for line in reversed(lines)
                     if any(level in line for level in ("CRITICAL", "ERROR", "Error"))),
                    lines[-1] if lines else "(empty log)")
        return said if len(said) <= 200 else said[:200] + " …"

    def count_in_log(self, text: str) -> int:
        return self.log().count(text)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``; the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL it (a supervisor: its whole process group, orphans included)."""
        if self.processes > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.alive():
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


def subscribers(r: redis.Redis) -> int:
    """How many clients are subscribed to the expired-event channel."""
    ((_, count),) = r.pubsub_numsub(EXPIRED_CHANNEL)
    return int(count)
