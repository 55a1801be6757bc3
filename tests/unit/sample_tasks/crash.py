"""Tasks for the quarantine tests: one that kills its process, ones that leave a trace in a
file (a quarantined run happens in another process, so a list in memory cannot see it)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from timers import task


def die(code: int = 1) -> None:
    """Kill the process, as a segfault in a C extension would."""
    os._exit(code)


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def note(path: str, word: str = "ran") -> None:
    """Append ``<word> <pid>`` to ``path``."""
    with open(path, "a") as f:
        f.write(f"{word} {os.getpid()}\n")


@task(rate="4/s")
def rated_note(path: str, word: str) -> None:
    """Append ``<word> <pid> <CLOCK_MONOTONIC>``: when a run of a rate of 4 a second began,
    in whichever process it ran (the clock is the machine's)."""
    with open(path, "a") as f:
        f.write(f"{word} {os.getpid()} {time.monotonic()}\n")


async def async_note(path: str) -> None:
    await asyncio.sleep(0)  # an await point (no time): a coroutine task that yields once
    note(path, "async")


def fail(message: str) -> None:
    raise LookupError(message)


@task(timeout=0.3)
def too_slow(seconds: float = 30.0) -> None:
    time.sleep(seconds)  # the work itself, past its timeout: not a wait


def linger(path: str, seconds: float = 30.0) -> None:
    """Note the pid, then take ``seconds``: still running when the listener stops."""
    note(path, "lingering")
    time.sleep(seconds)  # the work itself, not a wait for an outcome


def note_env(path: str, name: str) -> None:
    """Append the value of the environment variable ``name`` (or ``-``) to ``path``."""
    with open(path, "a") as f:
        f.write(os.environ.get(name, "-") + "\n")
