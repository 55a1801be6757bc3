"""Fixtures for the unit tests: keyspace, scripts and producer over the shared ``fake``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

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
