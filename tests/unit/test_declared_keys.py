"""The check that every key a script touches is one of its KEYS (``declared_keys.py``, on
for every unit test): it catches an undeclared key, and what it still lets pass is the
list of issue 28 finding 7 that is left (``NOT_DECLARED_YET``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import fakeredis

from tests.unit.declared_keys import NOT_DECLARED_YET, Undeclared, checking
from timers import Timers, TimerSpec
from timers.model.keys import SCRIPT_KEY_NAMES, Keyspace
from timers.store.scripts import GateRun, ScriptCalls, Scripts

KS = Keyspace()


def test_a_key_a_script_builds_for_itself_is_caught(
        fake: fakeredis.FakeRedis, every_key_declared: Undeclared) -> None:
    with checking(Undeclared(allow_known=False)) as found:
        fake.eval("redis.call('SET', KEYS[1], 1); return redis.call('GET', KEYS[1] .. 'x')",
                  1, "timers|a")
    assert found.found == [("(not a timers script)", "GET", "timers|ax")]
    assert every_key_declared.found == found.found  # (the suite's own check saw it too)
    every_key_declared.found.clear()


def test_the_helpers_keys_come_from_keys_and_only_data_named_keys_are_left(
        fake: fakeredis.FakeRedis) -> None:
    """Before the shared keys came in KEYS, a claim alone touched 24 undeclared keys
    (``P|queues``, ``P|held``, ``P|parked``, ``P|near`` …); now a keyed flow touches only
    keys named from data the script reads."""
    past = datetime.now(UTC) - timedelta(seconds=1)
    with Timers(fake) as t:
        t.schedule_many([TimerSpec("a.b", [i], at=past, key="dev-1", group="video")
                         for i in range(3)])
        t.cancel(t.schedule("a.b", [9], in_=60))
    scripts = Scripts(fake, KS)
    with checking(Undeclared(allow_known=False)) as found:
        reply = scripts.run(ScriptCalls(KS).claim(limit=10, lease_ms=5000, horizon_ms=0,
                                                  listener_id="h:1:a", groups=("video",)))
        tokens = [reply[i] for i in range(3, len(reply), 3)]
        scripts.gate(5000, [GateRun(token, "dev-1", 1) for token in tokens])
        scripts.finish(retention_ms=1000, endings=[(tokens[0], "ok", "", "")])
    left = sorted({key for _, _, key in found.found})
    assert left and all(NOT_DECLARED_YET.match(key) for key in left), left
    assert not any(key in KS.script_keys for key in left)
    assert any("|slots|dev-1" in key for key in left)  # the key's own structures: not yet


def test_the_shared_keys_are_named_as_the_lua_helpers_look_them_up() -> None:
    assert Keyspace("{t#1.5}").script_keys == tuple(f"{{t#1.5}}|{name}"
                                                    for name in SCRIPT_KEY_NAMES)
