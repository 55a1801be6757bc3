"""Helpers for the integration tests: listeners in threads, listener subprocesses, run logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from tests.conftest import ROOT, wait_until
from tests.task_pkg import RUNS, STARTED, URL_ENV
from timers import Fired, Listener, Timers
from timers.listener.tuning import event_loop
from timers.model.keys import Keyspace
from timers.model.percentiles import percentile

TASKS = "tests.task_pkg"
TIMERS_COMMAND = str(Path(sys.executable).parent / "timers")
KEYS = Keyspace()


class ListenerThread:
    """A :class:`Listener` running on its own event loop in a thread, its runs observed.

    The loop is the one ``timers listen`` would run (uvloop when installed, asyncio's
    with ``$TIMERS_LOOP=asyncio``).

    ``fired`` collects every :class:`Fired` report, in the order the runs ended.
    """

    def __init__(self, url: str, name: str = "listener", **options: Any) -> None:
        options.setdefault("tasks", TASKS)
        options.setdefault("shutdown_timeout", 5.0)
        self.url = url
        self.options = options
        self.fired: list[Fired] = []
        self.listener: Listener | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _observe(self, fired: Fired) -> None:
        with self._lock:
            self.fired.append(fired)

    def reports(self) -> list[Fired]:
        with self._lock:
            return list(self.fired)

    def _main(self) -> None:
        try:
            event_loop.run(self._run())
        except BaseException as exc:  # reported by stop()
            self.error = exc
        finally:
            self._ready.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.listener = Listener(self.url, observer=self._observe, **self.options)
        self._ready.set()
        await self.listener.run(self._stop)

    @property
    def subscribed(self) -> bool:
        return self.listener is not None and self.listener.subscribed.is_set()

    def start(self, wait_subscribed: bool = True) -> ListenerThread:
        self._thread.start()
        self._ready.wait(10)
        if wait_subscribed:
            wait_until(lambda: self.subscribed or self.error, 10,
                       message="the listener to subscribe")
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        if self._thread.is_alive() and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)
        assert not self._thread.is_alive(), "listener thread did not stop within 20 s"
        if self.error is not None:
            raise self.error


# -- what the test tasks recorded ------------------------------------------------------


def runs(r: redis.Redis) -> list[list[Any]]:
    """Every ``[tag, *extra]`` the test tasks recorded, in the order they ran."""
    return [json.loads(item) for item in r.lrange(RUNS, 0, -1)]


def run_counts(r: redis.Redis) -> Counter[str]:
    """How many times each tag ran."""
    return Counter(item[0] for item in runs(r))


def started(r: redis.Redis) -> list[str]:
    return list(r.lrange(STARTED, 0, -1))


def settled(t: Timers) -> bool:
    """Nothing pending and nothing running: no further run can happen."""
    stats = t.stats()
    return stats.pending == 0 and stats.running == 0


def redis_now_ms(r: redis.Redis) -> int:
    """Now on the Redis clock (``TIME``), in epoch ms: the clock due times, leases and rates
    are enforced with, to compare them with (never this machine's own)."""
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def redis_now(r: redis.Redis) -> datetime:
    """Now on the Redis clock, as an aware UTC datetime."""
    return datetime.fromtimestamp(redis_now_ms(r) / 1000, UTC)


def lateness_line(label: str, reports: list[Fired]) -> str:
    late = [f.lateness_ms for f in reports]
    sources = Counter(f.source for f in reports)
    worst = sorted(reports, key=lambda f: f.lateness_ms)[-3:]
    return (f"\n{label}: {len(late)} runs, lateness p50 {percentile(late, 50):.1f} ms, "
            f"p99 {percentile(late, 99):.1f} ms, max {max(late):.1f} ms; "
            f"sources {dict(sources)}; latest "
            + ", ".join(f"{f.timer_id} {f.lateness_ms:.1f} ms ({f.source})" for f in worst))


# -- subprocesses ----------------------------------------------------------------------


def subprocess_env() -> dict[str, str]:
    """The environment of a subprocess: no default Redis URL, and ``timers`` imported from
    this checkout (the one the tests import) whatever the venv's install points at."""
    env = dict(os.environ)
    env.pop("TIMERS_REDIS_URL", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


class Processes:
    """Subprocesses started by a test; every one is killed when the test ends."""

    def __init__(self, log_dir: Path, url: str) -> None:
        self.log_dir = log_dir
        self.url = url
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.sessions: set[int] = set()

    def env(self) -> dict[str, str]:
        env = subprocess_env()
        env[URL_ENV] = self.url
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def spawn(self, *command: str, own_session: bool = False,
              env: dict[str, str] | None = None, cwd: Path | None = None,
              ) -> subprocess.Popen[bytes]:
        """Start ``command`` in the repo root (or ``cwd``); its output goes to a log file.
        With ``own_session``, in a session and process group of its own, as a shell starts
        a foreground job or a service manager a service (``os.killpg(proc.pid, …)`` then
        signals it and its group alone)."""
        log_path = self.log_dir / f"proc-{len(self.started)}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                list(command), cwd=cwd or ROOT, env=env or self.env(), stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=own_session,
            )
        self.started.append((proc, log_path))
        if own_session:
            self.sessions.add(proc.pid)
        return proc

    def timers(self, *args: str) -> subprocess.Popen[bytes]:
        """``timers ARGS``: the installed command."""
        return self.spawn(TIMERS_COMMAND, *args)

    def timers_session(self, *args: str,
                       env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``timers ARGS`` in a session of its own (see :meth:`spawn`)."""
        return self.spawn(TIMERS_COMMAND, *args, own_session=True, env=env)

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        for candidate, path in self.started:
            if candidate is proc:
                return path.read_text(errors="replace")
        raise KeyError(proc)

    def cleanup(self) -> None:
        for proc, _ in self.started:
            if proc.pid in self.sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its children too
            elif proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(10)


def run_cli(*args: str, url: str | None = None, timeout: float = 30) -> (
        subprocess.CompletedProcess[str]):
    """Run ``timers ARGS`` to completion (the installed console script)."""
    env = subprocess_env()
    if url is not None:
        env[URL_ENV] = url
    command = [TIMERS_COMMAND, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
