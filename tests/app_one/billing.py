"""The first app's task."""

from __future__ import annotations

import json
import time

from tests.task_pkg import RUNS, client


def charge(tag: str) -> None:
    """Record that app one ran ``tag``, and when (wall clock)."""
    client().rpush(RUNS, json.dumps([tag, "app_one", time.time()]))
