"""Fixtures for the unit tests: keyspace, scripts and producer over the shared ``fake``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from tests.unit.declared_keys import Undeclared, checking
from timers import Timers
from timers.keys import Keyspace
from timers.scripts import ScriptName, register_all

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_TASKS = "tests.unit.sample_tasks"


@pytest.fixture
def ks() -> Keyspace:
    return Keyspace()


@pytest.fixture
def scripts(fake: fakeredis.FakeRedis) -> dict[ScriptName, Any]:
    return register_all(fake)


@pytest.fixture
def producer(fake: fakeredis.FakeRedis) -> Iterator[Timers]:
    with Timers(fake) as t:
        yield t


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """Supervisor.run() installs SIGTERM/SIGINT/SIGHUP handlers in this process: put them
    back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def every_key_declared() -> Iterator[Undeclared]:
    """Fail a test in which a script touched a key it was not given in KEYS (invariant 11:
    on Redis Cluster only KEYS are checked before a script runs)."""
    with checking(Undeclared()) as undeclared:
        yield undeclared
    if undeclared.found:
        seen = sorted(set(undeclared.found))
        pytest.fail(f"{len(seen)} key(s) touched by a script without being in its KEYS: "
                    + "; ".join(f"{s} {c} {k}" for s, c, k in seen[:12]), pytrace=False)
