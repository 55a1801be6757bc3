"""Fixtures for the unit tests: keyspace, scripts and producer over the shared ``fake``."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

# croniter's import runs `file` (platform.architecture), a process: imported here, before
# the guard below (timers imports it only where a cron is read)
import croniter  # noqa: F401
import fakeredis
import pytest

from tests.unit import no_processes
from tests.unit.declared_keys import Undeclared, checking
from tests.unit.sample_tasks import mod
from timers import Timers
from timers.model.keys import Keyspace
from timers.store.script_manifest import ScriptName
from timers.store.script_modes import register_all

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_TASKS = "tests.unit.sample_tasks"


def _no_process_or_server(item: pytest.Item) -> Generator[None, object, object]:
    """Each phase of every unit test (fixtures included, session ones too) runs under
    :func:`tests.unit.no_processes.forbid`: starting a process or a server fails it."""
    before = no_processes.children()
    with no_processes.forbid() as attempts:
        result = yield
    problem = no_processes.violations(attempts, before)
    if problem:
        pytest.fail(problem, pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _no_process_or_server(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _no_process_or_server(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _no_process_or_server(item))


@pytest.fixture(autouse=True)
def no_calls_of_earlier_tests() -> None:
    """``mod.CALLS`` starts empty in every test: a test that asserts what ran must not see
    the calls of a test run before it in the same worker (which tests share a worker
    varies with the machine's load)."""
    mod.CALLS.clear()


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
