"""Helpers of the flow-control unit tests: the scripts on fakeredis, timers added, claimed
and gated as a listener would."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.store.script_rows import GateRun, NewTimer
from timers.store.scripts import Scripts

KS = Keyspace()
LEASE = 10_000


@pytest.fixture
def s(fake: fakeredis.FakeRedis) -> Scripts:
    return Scripts(fake, KS)


def add(s: Scripts, id_: str, record: str = "t.f:", in_ms: int = -1) -> None:
    s.schedule([NewTimer(id_, record, "in", in_ms, "r")])


def claim(s: Scripts, limit: int = 10, groups: tuple[str, ...] = ("default",),
          lease: int = LEASE) -> list[Run]:
    reply = s.claim(limit=limit, lease_ms=lease, horizon_ms=0, listener_id="me",
                    groups=groups)
    items = reply[3:]
    return [Run.parse(items[i], items[i + 1], items[i + 2]) for i in range(0, len(items), 3)]


def gate(s: Scripts, runs: list[Run], **spec: Any) -> list[str]:
    reply = s.gate(LEASE, [GateRun(r.token, **spec) for r in runs])
    return [x.decode() for x in reply]


def finish(s: Scripts, run: Run) -> None:
    s.finish(retention_ms=1000, endings=[(run.token, "ok", "", "")])


def ids(runs: list[Run]) -> list[str]:
    return [r.timer_id for r in runs]
