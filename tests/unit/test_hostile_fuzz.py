"""Hostile expired events, fuzzed: whatever bytes arrive on ``__keyevent@0__:expired``, the
listener neither raises nor imports or runs anything outside its tasks package, and every
key in the timers namespace that names no runnable timer is recorded as rejected.

fakeredis publishes no keyspace events, so events are fed to ``listener.lanes[0].events.handle`` as
the subscription would deliver them (``tests/integration/test_hostile.py`` sends the same
names through a real server).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.sample_tasks import mod
from timers import Listener, Timers
from timers.exceptions import MalformedTimerKey
from timers.model.encoding import Entry, as_text

EXPIRED = b"__keyevent@0__:expired"
WAKE = b"timers|wake"
PREFIX = b"timers:"
RUNNABLE = {"top_level", "mod.add", "mod.greet", "mod.async_add", "mod.boom", "slow.work"}
"""Every task path that names a function of the sample package: only these may resolve."""
CANARY_MODULE = "hostile_canary"
"""A module outside the tasks package, already imported, whose function must never run."""

# -- hostile names ----------------------------------------------------------------------

HOSTILE_TASKS = [
    "..", "..mod.add", "mod..add", ".mod.add", "mod.add.", "/etc/passwd", "mod/add",
    "__import__", "__builtins__.eval", "mod.__class__", "mod.__init__", "mod.__dict__",
    "mod._private", "_private", "mod.__loader__.load_module",
    "builtins.eval", "builtins.exec", "builtins.__import__", "os.system", "os.popen",
    "subprocess.Popen", "sys.exit", "importlib.import_module", "pickle.loads",
    f"{CANARY_MODULE}.fire", f"..{CANARY_MODULE}.fire",
    # names imported into a real task module, or not functions of it
    "mod.system", "mod.json", "mod.json.loads", "mod.threading", "mod.threading.Thread",
    "mod.Any", "mod.Thing", "mod.VALUE", "mod.CALLS", "mod.CALLS.append", "mod._lock",
    "mod._record", "slow.asyncio", "slow.asyncio.sleep", "slow.DONE",
    # modules that are not there, or that fail to import
    "nosuch.task", "mod.nosuch", "broken.anything", "tests.unit.sample_tasks.mod.add",
    "x" * 201, "mod." + "a" * 300, "\uff4dod.add", "mod.add\x00", "mod.add\n",
]
"""Task paths a key may name that must never resolve."""

MALFORMED_ENTRIES = [
    b"", b":", b"::", b"id", b"id:", b"id:mod.add", b":mod.add:[]", b"%zz:mod.add:[1]",
    b"%3:mod.add:[]", b"id:mod.add:5", b"id:mod.add:\"text\"", b"id:mod.add:null",
    b"id:mod.add:true", b"id:mod.add:1.5e999", b"id:mod.add:[1", b"id:mod.add:{\"a\":}",
    b"id:mod.add:NaN", b"id:mod.add;x:[]", b"id:mod.add;=1:[]", b"id:mod.add;A=1:[]",
    b"id:mod.add;toolongkey=1:[]", b"id:mod.add;a=\xff:[]", b"\xff\xfe:mod.add:[1]",
    b"id:mod.add:[\"\xc3\x28\"]", b"id:mod.add:\xed\xa0\x80", b"id:\x00:[]",
    b"id:mod.add:" + b"[" * 100_000 + b"]" * 100_000,
    b"id:mod.add:" + b"{\"a\":" * 50_000 + b"1" + b"}" * 50_000,
    b"id:mod.add:[" + b"1," * 500_000 + b"1]",  # a 1 MB key
    b"x" * 1_000_000,
]
"""Entries (the part after ``timers:``) that do not decode."""


def hostile_keys() -> st.SearchStrategy[bytes]:
    """Keys in the timers namespace that must be rejected, never run."""
    ids = st.text(st.characters(codec="utf-8", exclude_characters=":"), min_size=1,
                  max_size=20).map(lambda s: s.replace("%", "%25"))
    args = st.sampled_from([b"", b"[]", b"[1]", b"{\"a\":1}", b"[\"__import__('os')\"]"])
    named = st.builds(
        lambda i, t, a: PREFIX + i.encode() + b":" + t.encode("utf-8", "surrogatepass")
        + b":" + a,
        ids, st.sampled_from(HOSTILE_TASKS), args)
    malformed = st.sampled_from(MALFORMED_ENTRIES).map(lambda e: PREFIX + e)
    random_tail = st.binary(max_size=300).map(lambda b: PREFIX + b)
    random_task = st.builds(
        lambda i, t, a: PREFIX + i.encode() + b":" + t + b":" + a,
        ids, st.binary(min_size=1, max_size=40), args)
    return st.one_of(named, malformed, random_tail, random_task).filter(
        lambda key: not runnable(key))


def runnable(key: bytes) -> bool:
    """Whether ``key`` names a timer the sample package could run (then it is no rejection:
    it goes to the claim, which runs only a pending timer's stored record)."""
    try:
        entry = Entry.decode(as_text(key[len(PREFIX):]))
    except MalformedTimerKey:
        return False
    return entry.record.task in RUNNABLE


# -- traps ------------------------------------------------------------------------------


class Traps:
    """Canaries for code that must never run, and a watch on what gets imported."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.modules_before = set(sys.modules)

    def canary(self, name: str) -> Callable[..., None]:
        def trap(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args))
            raise AssertionError(f"{name} was called by a hostile event: {args!r:.200}")
        return trap

    def new_modules_outside(self, package: str) -> set[str]:
        return {m for m in set(sys.modules) - self.modules_before
                if m != package and not m.startswith(package + ".")}


@contextlib.contextmanager
def traps() -> Iterator[Traps]:
    """Patch what a hostile name would reach for; ``builtins.exec`` stays, since the import
    system itself runs every module it loads through it."""
    found = Traps()
    canary = types.ModuleType(CANARY_MODULE)
    canary.fire = found.canary("hostile_canary.fire")  # type: ignore[attr-defined]
    patches = [(os, "system"), (os, "popen"), (os, "execv"), (os, "execvp"),
               (subprocess, "Popen"), (builtins, "eval"), (sys, "exit")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in patches]
    sys.modules[CANARY_MODULE] = canary
    found.modules_before.add(CANARY_MODULE)
    try:
        for obj, name in patches:
            setattr(obj, name, found.canary(f"{getattr(obj, '__name__', obj)}.{name}"))
        yield found
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        sys.modules.pop(CANARY_MODULE, None)


def make_listener(server: fakeredis.FakeServer) -> Listener:
    return Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                    search_path=str(ROOT))


@pytest.fixture(scope="module")
def listener() -> Listener:
    """One listener for the event-handling properties (nothing here needs its loop)."""
    return make_listener(fakeredis.FakeServer())


def feed(listener: Listener, channel: bytes, data: bytes) -> None:
    listener.lanes[0].events.handle({"type": "message", "pattern": None, "channel": channel,
                            "data": data})


@pytest.fixture(autouse=True)
def clean_calls() -> Iterator[None]:
    mod.CALLS.clear()
    yield
    mod.CALLS.clear()


# -- properties of one event ------------------------------------------------------------


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(key=hostile_keys())
def test_a_hostile_key_is_rejected_once_and_nothing_else_happens(
        listener: Listener, key: bytes) -> None:
    written = len(listener.lanes[0].endings)
    listener.lanes[0].events.pending.clear()
    with traps() as found:
        feed(listener, EXPIRED, key)
    assert found.calls == [] and mod.CALLS == []
    assert found.new_modules_outside(SAMPLE_TASKS) == set()
    assert listener.lanes[0].events.pending == {}, "a rejected key must not reach the claim"
    endings = listener.lanes[0].endings.queued()[written:]
    ((token, kind, failure_id, data),) = [e.wire() for e in endings]
    assert (token, kind) == ("", "reject")
    assert failure_id
    record = json.loads(data)
    assert record["kind"] == "rejected"
    assert record["key"] == key[:300].decode("utf-8", "backslashreplace")


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(channel=st.sampled_from([EXPIRED, WAKE, b"other", b"__keyevent@1__:expired"]),
       data=st.one_of(st.binary(max_size=2000),
                      st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
                      hostile_keys(),
                      st.binary(max_size=200).map(lambda b: b"timers|" + b)))
def test_no_event_makes_the_listener_raise_import_or_run_anything(
        listener: Listener, channel: bytes, data: bytes) -> None:
    written = len(listener.lanes[0].endings)
    listener.lanes[0].events.pending.clear()
    with traps() as found:
        feed(listener, channel, data)
    new_endings = listener.lanes[0].endings.queued()[written:]
    assert found.calls == [] and mod.CALLS == []
    assert found.new_modules_outside(SAMPLE_TASKS) == set()
    if channel == EXPIRED and data.startswith(PREFIX):
        # one outcome: to the claim (a runnable name) or recorded as rejected
        assert len(new_endings) + len(listener.lanes[0].events.pending) == 1
        assert bool(listener.lanes[0].events.pending) == runnable(data)
    else:
        assert new_endings == [] and listener.lanes[0].events.pending == {}


# -- the whole listener -----------------------------------------------------------------


async def _burst(server: fakeredis.FakeServer, keys: list[bytes], producer: Timers) -> None:
    listener = make_listener(server)
    for key in keys:
        feed(listener, EXPIRED, key)
    producer.schedule("mod.add", [1, 2], in_=0)  # a normal timer, after the hostile ones
    await asyncio.wait_for(listener.run(burst=True), 15)
    await listener.redis.aclose()


def _failure_group(key: bytes) -> str:
    """Keys whose entry decodes share a record per timer id (the first one wins); any other
    key has a record of its own."""
    try:
        return "id:" + Entry.decode(as_text(key[len(PREFIX):])).id
    except MalformedTimerKey:
        return "key:" + key.hex()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(keys=st.lists(hostile_keys(), min_size=1, max_size=15, unique=True))
def test_a_listener_fed_hostile_keys_records_each_and_runs_the_next_timer(
        keys: list[bytes]) -> None:
    mod.CALLS.clear()
    server = fakeredis.FakeServer()
    producer = Timers(fakeredis.FakeRedis(server=server))
    with traps() as found:
        asyncio.run(_burst(server, keys, producer))
    assert found.calls == []
    assert mod.CALLS == [("add", (1, 2))], "the normal timer ran, once, and nothing else"
    assert found.new_modules_outside(SAMPLE_TASKS) == set()

    failures = producer.failed(limit=1000)
    assert {f.data["kind"] for f in failures} == {"rejected"}
    groups = {_failure_group(k) for k in keys}
    assert len(failures) == len(groups)
    recorded = {f.data["key"] for f in failures}
    for group in groups:
        members = [k for k in keys if _failure_group(k) == group]
        assert any(k[:300].decode("utf-8", "backslashreplace") in recorded for k in members)
    stats = producer.stats()
    assert stats.counters.get("rejected") == len(groups)
    assert (stats.fired, stats.pending, stats.running) == (1, 0, 0)
    producer.close()


@pytest.mark.parametrize("task", HOSTILE_TASKS)
def test_each_hostile_task_name_is_refused(task: str) -> None:
    server = fakeredis.FakeServer()
    producer = Timers(fakeredis.FakeRedis(server=server))
    key = PREFIX + b"victim:" + task.encode("utf-8", "surrogatepass") + b":[]"
    with traps() as found:
        asyncio.run(_burst(server, [key], producer))
    assert found.calls == [] and mod.CALLS == [("add", (1, 2))]
    assert found.new_modules_outside(SAMPLE_TASKS) == set()
    (failure,) = producer.failed()
    assert failure.data["kind"] == "rejected"
    producer.close()


@pytest.mark.parametrize("task", HOSTILE_TASKS)
def test_a_pending_timer_stored_with_a_hostile_task_is_refused_not_run(task: str) -> None:
    """What runs is the record stored with a pending timer, so that is the last line: a
    record written straight into Redis (past the producer's checks) naming code outside
    the package is refused when claimed, recorded, and never called."""
    server = fakeredis.FakeServer()
    raw = fakeredis.FakeRedis(server=server)
    producer = Timers(raw)
    keys = producer.keys
    record = task.encode("utf-8", "surrogatepass") + b':["__import__(\'os\').system(\'x\')"]'
    raw.hset(keys.records, "planted", record)
    raw.zadd(keys.due, {"planted": 0})
    with traps() as found:
        asyncio.run(_burst(server, [], producer))
    assert found.calls == [] and mod.CALLS == [("add", (1, 2))]
    assert found.new_modules_outside(SAMPLE_TASKS) == set()
    failure = producer.get_failure("planted")
    assert failure is not None and failure.data["kind"] in {"refused", "malformed"}
    assert producer.stats().pending == 0
    producer.close()
