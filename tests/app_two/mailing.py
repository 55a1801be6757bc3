"""The second app's task."""

from __future__ import annotations

import json

from tests.task_pkg import RUNS, client


def send(tag: str) -> None:
    """Record that app two ran ``tag``."""
    client().rpush(RUNS, json.dumps([tag, "app_two"]))
