"""A task that only records that it ran, and with which args."""

from __future__ import annotations

import json
import os
import time

import timers
from tests.task_pkg import RUNS, client


def hit(tag: str, *extra: object) -> None:
    """Append ``[tag, *extra]`` to ``test:runs``."""
    client().rpush(RUNS, json.dumps([tag, *extra]))


def hit_pid(tag: str) -> None:
    """Append ``[tag, pid]`` to ``test:runs``: which process ran it."""
    client().rpush(RUNS, json.dumps([tag, os.getpid()]))


async def ahit(tag: str, *extra: object) -> None:
    """The same as :func:`hit`, as an ``async def`` task (runs on the listener's loop)."""
    client().rpush(RUNS, json.dumps([tag, *extra]))


def late(tag: str, due_ms: float) -> None:
    """Append ``[tag, ms late]`` to ``test:runs``: how long after ``due_ms`` (epoch ms, this
    machine's clock, which the test's Redis servers share) the task started."""
    client().rpush(RUNS, json.dumps([tag, time.time() * 1000 - due_ms]))


@timers.task(history_count=3)
def counted(tag: str) -> None:
    """As :func:`hit`; the run history keeps at most its three newest ended timers."""
    client().rpush(RUNS, json.dumps([tag]))


def collector_state(tag: str) -> None:
    """Append ``[tag, young collection threshold, objects frozen]`` of the process it runs
    in to ``test:runs``."""
    import gc

    client().rpush(RUNS, json.dumps([tag, gc.get_threshold()[0], gc.get_freeze_count()]))
