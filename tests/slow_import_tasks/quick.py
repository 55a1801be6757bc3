"""A task that records its run at once."""

from __future__ import annotations

import json

from tests.task_pkg import RUNS, client


def hit(tag: str) -> None:
    client().rpush(RUNS, json.dumps([tag, "quick"]))
