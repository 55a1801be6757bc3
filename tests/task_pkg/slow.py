"""A task that blocks, so a test can kill its listener in the middle of it."""

from __future__ import annotations

import json
import time

from tests.task_pkg import RUNS, STARTED, client

RELEASE = "test:release"


def block(tag: str, seconds: float = 20.0) -> None:
    """Record the start, wait until the key ``test:release`` exists (or ``seconds`` pass),
    then record the run in ``test:runs`` with ``"released"`` or ``"deadline"``."""
    r = client()
    r.rpush(STARTED, tag)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if r.exists(RELEASE):
            r.rpush(RUNS, json.dumps([tag, "released"]))
            return
        time.sleep(0.02)  # polls for the release, with the deadline above
    r.rpush(RUNS, json.dumps([tag, "deadline"]))
