"""The check that every key a script touches is one of its KEYS (``declared_keys.py``, on
for every unit test): it catches an undeclared key, and none is let through any more (a
script asks for the keys named by data it reads: ``lua/declare.lua``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import fakeredis

from tests.unit.declared_keys import Undeclared, checking
from timers import Timers, TimerSpec
from timers.model.keys import SCRIPT_KEY_NAMES, Keyspace
from timers.store.script_calls import ScriptCalls
from timers.store.script_rows import GateRun, Taker
from timers.store.scripts import Scripts

KS = Keyspace()


def test_a_key_a_script_builds_for_itself_is_caught(
        fake: fakeredis.FakeRedis, every_key_declared: Undeclared) -> None:
    with checking(Undeclared()) as found:
        fake.eval("redis.call('SET', KEYS[1], 1); return redis.call('GET', KEYS[1] .. 'x')",
                  1, "timers|a")
    assert found.found == [("(not a timers script)", "GET", "timers|ax")]
    assert every_key_declared.found == found.found  # (the suite's own check saw it too)
    every_key_declared.found.clear()


def test_a_keyed_flow_of_a_group_touches_only_keys_it_was_given_or_asked_for(
        fake: fakeredis.FakeRedis) -> None:
    """Before the shared keys came in KEYS, a claim alone touched 24 undeclared keys
    (``P|queues``, ``P|held``, ``P|parked``, ``P|near`` …); then a keyed flow still
    touched keys named from data the script reads (a group's due index and running set,
    a key's slots and queue, the timers' expiring keys); now it asks for those."""
    past = datetime.now(UTC) - timedelta(seconds=1)
    with Timers(fake) as t:
        t.schedule_many([TimerSpec("a.b", [i], at=past, key="dev-1", group="video")
                         for i in range(3)])
        t.cancel(t.schedule("a.b", [9], in_=60))
    scripts = Scripts(fake, KS)
    with checking(Undeclared()) as found:
        reply = scripts.run(ScriptCalls(KS).claim(limit=10, lease_ms=5000, horizon_ms=0,
                                                  listener_id="h:1:a", groups=("video",)))
        tokens = [reply[i] for i in range(3, len(reply), 3)]
        assert scripts.gate(5000, [GateRun(token, "dev-1", 1) for token in tokens]) == [
            b"go", b"wait", b"wait"]
        handed = scripts.finish(retention_ms=1000, endings=[(tokens[0], "ok", "", "")],
                                taker=Taker("h:1:a", ("video",), 1, 5000, True))
    assert found.found == []
    assert len(handed) == 1 + 2 * 3  # the two waiting: one holding the slot, one next


def test_the_shared_keys_are_named_as_the_lua_helpers_look_them_up() -> None:
    assert Keyspace("{t#1.5}").script_keys == tuple(f"{{t#1.5}}|{name}"
                                                    for name in SCRIPT_KEY_NAMES)
