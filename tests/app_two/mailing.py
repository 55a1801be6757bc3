"""The second app's task."""

from __future__ import annotations

import json
import time

from tests.task_pkg import RUNS, client


def send(tag: str) -> None:
    """Record that app two ran ``tag``, and when (wall clock)."""
    client().rpush(RUNS, json.dumps([tag, "app_two", time.time()]))
