"""Hostile timer keys through a real server: published on ``__keyevent@0__:expired`` with
redis-py, and set as real keys with a tiny TTL so that Redis itself expires them and sends
the event. The listener (in this process, so its imports and calls can be watched) must
neither stop nor import or run anything outside its tasks package, must record each key as
a rejected timer, and must go on firing a normal timer scheduled afterwards.
"""

from __future__ import annotations

import builtins
import os
import random
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import TASKS, ListenerThread, run_counts
from timers import Failure, Timers
from timers.model.keys import Keyspace

pytestmark = pytest.mark.integration

EXPIRED = Keyspace.expired_channel(0)
CANARY_MODULE = "hostile_canary"

Key = Callable[[str], bytes]
"""A hostile key, given a tag that makes it unique (and its failure record its own)."""


def named(task: str, args: bytes = b"[]") -> Key:
    return lambda tag: b"timers:" + tag.encode() + b":" + task.encode() + b":" + args


def raw(template: bytes) -> Key:
    return lambda tag: template.replace(b"{tag}", tag.encode())


_random = random.Random(20261122)
HOSTILE: dict[str, Key] = {
    # malformed encodings
    "bad escape": raw(b"timers:%zz{tag}:record.hit:[1]"),
    "no record": raw(b"timers:{tag}"),
    "empty record": raw(b"timers:{tag}:"),
    "no args separator": raw(b"timers:{tag}:record.hit"),
    "bad option": raw(b"timers:{tag}:record.hit;x:[1]"),
    "bad JSON": raw(b"timers:{tag}:record.hit:[1,"),
    "random bytes": lambda tag: b"timers:" + tag.encode() + b":" + _random.randbytes(200),
    # huge names
    "1 MB task path": raw(b"timers:{tag}:" + b"a" * 1_000_000 + b":[]"),
    "1 MB of unfinished JSON": raw(b"timers:{tag}:record.hit:[" + b"1," * 500_000),
    # not UTF-8
    "invalid UTF-8 id": raw(b"timers:{tag}\xff\xfe:record.hit:[1]"),
    "invalid UTF-8 args": raw(b"timers:{tag}:record.hit:[\"\xc3\x28\"]"),
    "surrogate in args": raw(b"timers:{tag}:record.hit:[\"\xed\xa0\x80\"]"),
    # JSON that is neither a list nor an object, or too deep
    "JSON number": raw(b"timers:{tag}:record.hit:42"),
    "JSON string": raw(b"timers:{tag}:record.hit:\"tag\""),
    "JSON null": raw(b"timers:{tag}:record.hit:null"),
    "deeply nested list": raw(b"timers:{tag}:record.hit:" + b"[" * 100_000 + b"]" * 100_000),
    "deeply nested object": raw(b"timers:{tag}:record.hit:" + b"{\"a\":" * 50_000 + b"1"
                                + b"}" * 50_000),
    # task paths that reach outside the package
    "..": named(".."),
    "..record.hit": named("..record.hit"),
    "record..hit": named("record..hit"),
    "dunder import": named("__import__", b"[\"os\"]"),
    "dunder attribute": named("record.__dict__"),
    "dunder loader": named("record.__loader__.load_module"),
    "private name": named("record._private"),
    "builtins.eval": named("builtins.eval", b"[\"__import__('os').system('id')\"]"),
    "builtins.exec": named("builtins.exec", b"[\"import os\"]"),
    "os.system": named("os.system", b"[\"touch /tmp/owned\"]"),
    "subprocess.Popen": named("subprocess.Popen", b"[[\"id\"]]"),
    "canary module": named(f"{CANARY_MODULE}.fire"),
    # names imported into real task modules of the package, or not functions of them
    "record.json": named("record.json"),
    "record.json.loads": named("record.json.loads", b"[\"1\"]"),
    "slow.time.sleep": named("slow.time.sleep", b"[100]"),
    "slow.json.dumps": named("slow.json.dumps", b"[1]"),
    "package os": named("os"),
    "package threading.Lock": named("threading.Lock"),
    "fail.TaskBroke (a class)": named("fail.TaskBroke"),
    "record.RUNS (a string)": named("record.RUNS"),
    "no such module": named("nosuch.task"),
}


@pytest.fixture
def raw_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


class Canaries:
    """Things a hostile key would reach for, replaced by traps that record any call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, Any]] = []
        canary = types.ModuleType(CANARY_MODULE)
        canary.fire = self.trap(f"{CANARY_MODULE}.fire")  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, CANARY_MODULE, canary)
        for obj, name in ((os, "system"), (os, "popen"), (os, "execv"),
                          (subprocess, "Popen"), (builtins, "eval")):
            monkeypatch.setattr(obj, name, self.trap(f"{obj.__name__}.{name}"))

    def trap(self, name: str) -> Callable[..., None]:
        def called(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args))
            raise AssertionError(f"{name} called by a hostile key")
        return called


def rejected(t: Timers) -> dict[str, Failure]:
    """The rejected-key records by the key they name (as the record shows it)."""
    return {f.data["key"]: f for f in t.failed(limit=1000) if f.data.get("kind") == "rejected"}


def shown(key: bytes) -> str:
    """A key as its failure record shows it."""
    return key[:300].decode("utf-8", "backslashreplace")


def send_hostile(raw_redis: redis.Redis, keys: dict[str, Key]) -> list[bytes]:
    """Publish each key as an expired event, and set it again (another tag) with a 1 ms
    TTL for Redis to expire; returns every key sent."""
    sent = []
    for i, make in enumerate(keys.values()):
        published, expiring = make(f"pub{i}"), make(f"set{i}")
        raw_redis.publish(EXPIRED, published)
        raw_redis.set(expiring, 1, px=1)
        sent += [published, expiring]
    return sent


def fire_normal_timer(t: Timers, r: redis.Redis, tag: str) -> None:
    t.schedule("record.hit", [tag], in_=0.05)
    wait_until(lambda: run_counts(r)[tag] == 1, 10, message=f"the normal timer {tag!r} to run")


def test_hostile_keys_are_rejected_and_nothing_outside_the_package_runs(
        start_listener: Callable[..., ListenerThread], timers_client: Timers,
        raw_redis: redis.Redis, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    listener = start_listener()
    fire_normal_timer(timers_client, r, "before")  # warm up: every lazy import is done
    canaries = Canaries(monkeypatch)
    modules_before = set(sys.modules)

    sent = send_hostile(raw_redis, HOSTILE)
    raw_redis.publish(EXPIRED, b'timers:forged:record.hit:["forged"]')  # runnable, not pending
    wait_until(lambda: len(rejected(timers_client)) >= len(sent), 20,
               message=f"{len(sent)} hostile keys to be recorded as rejected")
    fire_normal_timer(timers_client, r, "after")

    assert listener.error is None and listener.subscribed
    assert canaries.calls == []
    new_modules = set(sys.modules) - modules_before
    assert {m for m in new_modules if not m.startswith(TASKS + ".")} == set()
    assert run_counts(r) == {"before": 1, "after": 1}, "nothing ran but the normal timers"
    records = rejected(timers_client)
    missing = [key[:80] for key in sent if shown(key) not in records]
    assert missing == []
    assert len(records) == len(sent)
    # the task's own mark is written before its ending reaches Redis: wait for the ending
    wait_until(lambda: timers_client.stats().counters.get("fired") == 2, 10,
               message="both normal timers' endings to be written")
    assert timers_client.stats().counters.get("rejected") == len(sent)
    assert timers_client.get_failure("forged") is None
    reports = listener.reports()
    assert [f.task for f in reports] == ["record.hit", "record.hit"]
    assert all(f.outcome.ok for f in reports)


REAL_TASKS_HOSTILE: dict[str, Key] = {
    "reminders.os": named("reminders.os"),
    "reminders.logging": named("reminders.logging"),
    "reminders.logging.shutdown": named("reminders.logging.shutdown"),
    "reminders.log (a logger)": named("reminders.log"),
    "reminders.log.info": named("reminders.log.info", b"[\"x\"]"),
    "orders.asyncio.sleep": named("orders.asyncio.sleep", b"[100]"),
    "webhooks.log.error": named("webhooks.log.error", b"[\"x\"]"),
    "reminders.__builtins__": named("reminders.__builtins__"),
    "tasks.reminders.sms": named("tasks.reminders.sms", b"[1]"),
}


def test_names_reaching_into_the_example_tasks_package_are_rejected(
        start_listener: Callable[..., ListenerThread], timers_client: Timers,
        raw_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with the repository's example package ``tasks``: what its modules import
    (``logging``, ``asyncio``) and their module-level objects are not tasks."""
    listener = start_listener(tasks="tasks", search_path=str(ROOT))
    timers_client.schedule("reminders.sms", [1], in_=0)
    wait_until(lambda: len(listener.reports()) == 1, 10, message="a real task to run")
    canaries = Canaries(monkeypatch)
    modules_before = set(sys.modules)

    sent = send_hostile(raw_redis, REAL_TASKS_HOSTILE)
    wait_until(lambda: len(rejected(timers_client)) >= len(sent), 20,
               message=f"{len(sent)} hostile keys to be recorded as rejected")
    timers_client.schedule("reminders.email", [7, "hello"], in_=0.05)
    wait_until(lambda: len(listener.reports()) == 2, 10, message="a normal timer to run")

    assert listener.error is None and canaries.calls == []
    assert {m for m in set(sys.modules) - modules_before if not m.startswith("tasks.")} == set()
    assert all(f.outcome.ok for f in listener.reports())
    records = rejected(timers_client)
    assert sorted(records) == sorted(shown(key) for key in sent)
