"""A task that leaks memory on purpose: 1 MB kept for the life of the process per run."""

from __future__ import annotations

import json

from tests.task_pkg import RUNS, client

MB = 1 << 20
_kept: list[bytes] = []


def hit(tag: str) -> None:
    """Keep 1 MB (written, so it is resident), then append ``[tag]`` to ``test:runs``."""
    _kept.append(b"\x01" * MB)
    client().rpush(RUNS, json.dumps([tag]))
