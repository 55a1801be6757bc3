"""The first app's task."""

from __future__ import annotations

import json

from tests.task_pkg import RUNS, client


def charge(tag: str) -> None:
    """Record that app one ran ``tag``."""
    client().rpush(RUNS, json.dumps([tag, "app_one"]))
