"""A script that needs keys it was not given asks for them before its first write, and its
caller calls it again with them (``timers/store/declare.py``, ``lua/declare.lua``): on
Redis Cluster only KEYS are checked before a script runs."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest
import redis.exceptions

from timers import Timers, TimerSpec
from timers.exceptions import KeysNotDeclared
from timers.listener.retrying import RETRYABLE
from timers.model.keys import Keyspace
from timers.ops.base import Call
from timers.producer.transport import run_async, run_sync
from timers.store.declare import MAX_CALLS, AsyncDeclaring, Declaring, asked_keys
from timers.store.lua_source import source
from timers.store.script_calls import ScriptCalls
from timers.store.script_modes import declares_keys
from timers.store.script_rows import GateRun
from timers.store.scripts import Scripts

KS = Keyspace()

ASKS_FOR_ITS_SECOND_KEY = """
if not KEYS[2] then return {{'timers:keys'}, KEYS[1] .. ':more'} end
redis.call('SET', KEYS[2], ARGV[1])
return {'set', KEYS[2]}
"""

ASKS_FOREVER = "return {{'timers:keys'}, 'k' .. (#KEYS + 1)}"


class Counting:
    """A registered script that counts its calls."""

    def __init__(self, script: Any) -> None:
        self.inner, self.calls = script, 0
        self.sha, self.script = script.sha, script.script

    def __call__(self, keys: Any = (), args: Any = (), client: Any = None) -> Any:
        self.calls += 1
        return self.inner(keys=keys, args=args, client=client)


def _declaring(fake: fakeredis.FakeRedis, lua: str, cluster: bool = False) -> Declaring:
    return Declaring("test", Counting(fake.register_script(lua)), cluster)


def test_the_lanes_kept_keys_are_sized_by_the_scripts_own_window() -> None:
    """A lane keeps the keys of ``declare.lua``'s window and a claim more
    (``KnownKeys.most``): the two numbers are one, written in Lua and in Python."""
    import re

    from timers.listener.finding.claimer import DECLARE_WINDOW

    lua = re.search(r"local DECLARE_WINDOW = (\d+)", source("claim", declare=True))
    assert lua is not None and int(lua.group(1)) == DECLARE_WINDOW


def test_a_script_that_asks_for_a_key_is_called_again_with_it(
        fake: fakeredis.FakeRedis) -> None:
    script = _declaring(fake, ASKS_FOR_ITS_SECOND_KEY)
    assert script(keys=["{a}"], args=["v"]) == [b"set", b"{a}:more"]
    assert fake.get("{a}:more") == b"v"
    assert script.runner.calls == script.last_calls == 2  # (a claimer reads it: its clock)


def test_a_script_that_keeps_asking_fails_clearly_after_a_few_calls(
        fake: fakeredis.FakeRedis) -> None:
    script = _declaring(fake, ASKS_FOREVER)
    # as a cluster's -TRYAGAIN, which a listener's loops outlive: they call again later
    with pytest.raises(redis.exceptions.TryAgainError, match=f"after {MAX_CALLS} calls") as raised:
        script(keys=["k1"])
    assert script.runner.calls == MAX_CALLS
    assert isinstance(raised.value, RETRYABLE)
    assert isinstance(raised.value.__cause__, KeysNotDeclared)


def test_a_key_outside_the_slot_of_the_call_is_not_sent_on_a_cluster(
        fake: fakeredis.FakeRedis) -> None:
    script = _declaring(fake, ASKS_FOR_ITS_SECOND_KEY.replace(
        "KEYS[1] .. ':more'", "'{other}:more'"), cluster=True)
    with pytest.raises(KeysNotDeclared, match="outside its shard's slot"):
        script(keys=["{a}"], args=["v"])
    assert script.runner.calls == 1
    assert fake.get("{other}:more") is None


def test_a_key_asked_for_again_is_a_clear_error(fake: fakeredis.FakeRedis) -> None:
    script = _declaring(fake, "return {{'timers:keys'}, KEYS[1]}")
    with pytest.raises(KeysNotDeclared, match="given already"):
        script(keys=["k1"])


def test_asyncio_callers_call_again_too() -> None:
    fake = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    script = AsyncDeclaring("test", fake.register_script(ASKS_FOR_ITS_SECOND_KEY))
    assert asyncio.run(script(keys=["{a}"], args=["v"])) == [b"set", b"{a}:more"]


def test_a_pipeline_sends_again_only_the_calls_that_asked(fake: fakeredis.FakeRedis) -> None:
    asks, plain = _declaring(fake, ASKS_FOR_ITS_SECOND_KEY), _declaring(fake, "return 7")
    scripts: Any = {"renew": asks, "heartbeat": plain}
    request = [Call(script="heartbeat"), Call(script="renew", keys=("{a}",), args=("v",)),
               Call(command=("GET", "{a}:more"))]
    assert run_sync(fake, scripts, request) == [7, [b"set", b"{a}:more"], None]
    assert (plain.runner.calls, asks.runner.calls) == (0, 1)  # sent again alone
    assert fake.get("{a}:more") == b"v"


def test_an_asyncio_pipeline_sends_again_the_calls_that_asked() -> None:
    fake = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    scripts: Any = {"renew": AsyncDeclaring("renew", fake.register_script(
        ASKS_FOR_ITS_SECOND_KEY)), "heartbeat": AsyncDeclaring(
        "heartbeat", fake.register_script("return 7"))}
    request = [Call(script="renew", keys=("{a}",), args=("v",)), Call(script="heartbeat")]
    assert asyncio.run(run_async(fake, scripts, request)) == [[b"set", b"{a}:more"], 7]


def test_no_plain_reply_reads_as_asking() -> None:
    for reply in ([], [1, 2], [b"a", [b"b"]], [b"timers:keys", b"k"], b"timers:keys", None,
                  0):
        assert asked_keys(reply) is None
    assert asked_keys([[b"timers:keys"], b"k"]) == [b"k"]


def test_a_single_server_runs_scripts_without_their_declare_part(
        fake: fakeredis.FakeRedis) -> None:
    assert "keys_asked()" in source("renew", declare=True)
    assert "keys_asked" not in source("renew")
    assert "-- declare {" not in source("renew")
    assert declares_keys(fake)  # the unit tests run it, so their check proves it complete


def test_a_renewal_asks_for_the_slot_and_group_of_its_runs_and_extends_them(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake) as t:
        t.schedule_many([TimerSpec("a.b", [i], in_=-1, key="dev-1", group="video")
                         for i in range(2)])
    scripts = Scripts(fake, KS)
    reply = scripts.run(ScriptCalls(KS).claim(limit=10, lease_ms=5000, horizon_ms=0,
                                              listener_id="h:1:a", groups=("video",)))
    tokens = [reply[i] for i in range(3, len(reply), 3)]
    assert scripts.gate(5000, [GateRun(tok, "dev-1", 1) for tok in tokens]) == [b"go", b"wait"]
    before = fake.zscore(f"{KS.prefix}|slots|dev-1", tokens[0])
    assert scripts.renew(60_000, tokens) == [tokens[1]]  # the one held back runs no more
    assert fake.zscore(f"{KS.prefix}|slots|dev-1", tokens[0]) > before
    assert fake.zscore(KS.running_of("video"), tokens[0]) > before


def test_a_claim_asks_at_once_for_timers_that_come_due_within_a_second(
        fake: fakeredis.FakeRedis) -> None:
    """Time moves between two calls of a claim: timers that come due meanwhile must not
    make the next call ask again (under a steady stream it would ask on every call)."""
    with Timers(fake) as t:
        now_id = t.schedule("a.b", [1], in_=-1, group="video")
        soon_id = t.schedule("a.b", [2], in_=0.5, group="video")
        later_id = t.schedule("a.b", [3], in_=5, group="video")
    call = ScriptCalls(KS).claim(limit=10, lease_ms=5000, horizon_ms=0, listener_id="h:1:a",
                                 groups=("video",))
    runner = Scripts(fake, KS).script("claim").runner  # (not called again by itself)
    keys = list(call.keys)
    reply = runner(keys=keys, args=list(call.args))
    while (more := asked_keys(reply)) is not None:  # level by level: the index, then keys
        keys += [key.decode() for key in more]
        reply = runner(keys=keys, args=list(call.args))
    declared = " ".join(keys)
    assert f":{now_id}:" in declared and f":{soon_id}:" in declared
    assert f":{later_id}:" not in declared
    assert [reply[i + 1].decode().split("|")[2] for i in range(3, len(reply), 3)] == [
        f"{now_id}:a.b;g=video:[1]"]


def _claim(scripts: Scripts, limit: int, known: list[str]) -> list[str]:
    """The ids a claim of the default group took (``known``: the keys passed with it)."""
    reply = scripts.claim(limit=limit, lease_ms=5000, horizon_ms=0, listener_id="h:1:a",
                          known_keys=known)
    return [reply[i + 1].decode().split("|")[2].split(":")[0] for i in range(3, len(reply), 3)]


def test_a_claim_given_the_keys_its_last_claim_asked_for_is_one_call(
        fake: fakeredis.FakeRedis) -> None:
    """A lane passes the keys its last claim asked for (``finding/claimer.py``
    ``KnownKeys``): the window of due timers they name serves the next claims at once."""
    with Timers(fake) as t:
        ids = [t.schedule("a.b", [i], in_=-10 + i * 0.01) for i in range(6)]
    scripts = Scripts(fake, KS)
    script = scripts.script("claim")
    assert _claim(scripts, 2, []) == ids[:2]
    assert script.last_calls == 2
    known = [key.decode() for key in script.last_asked]
    assert all(any(f":{i}:" in key for key in known) for i in ids)  # the whole window
    assert _claim(scripts, 2, known) == ids[2:4]
    assert (script.last_calls, script.last_asked) == (1, [])
    assert _claim(scripts, 2, known) == ids[4:]
    assert script.last_calls == 1


def test_a_claim_given_old_keys_asks_for_a_due_timer_they_do_not_name(
        fake: fakeredis.FakeRedis) -> None:
    """Keys passed from a past claim name timers due later: a timer that came due before
    them since is asked for, and claimed now, not left behind them."""
    with Timers(fake) as t:
        first = t.schedule("a.b", ["first"], in_=-1)
        later = [t.schedule("a.b", [i], in_=0.5 + i * 0.01) for i in range(3)]
    scripts = Scripts(fake, KS)
    script = scripts.script("claim")
    assert _claim(scripts, 2, []) == [first]
    known = [key.decode() for key in script.last_asked]
    assert all(any(f":{i}:" in key for key in known) for i in later)  # due within 1 s
    assert _claim(scripts, 2, known) == []
    assert script.last_calls == 1  # nothing due: nothing asked
    with Timers(fake) as t:
        now_id = t.schedule("a.b", ["now"], in_=-1)
    assert _claim(scripts, 2, known) == [now_id]
    assert script.last_calls == 2


class _AsyncCounting:
    """An asyncio registered script that counts its calls."""

    def __init__(self, script: Any) -> None:
        self.inner, self.calls = script, 0
        self.sha, self.script = script.sha, script.script

    async def __call__(self, keys: Any = (), args: Any = (), client: Any = None) -> Any:
        self.calls += 1
        return await self.inner(keys=keys, args=args, client=client)


def test_a_lanes_claims_in_a_backlog_are_one_call_each_and_in_due_order() -> None:
    """The claimer passes the keys its last claims asked for (``KnownKeys``): in a backlog
    only its first claim asks; the keys of the timers it claimed are not passed again."""
    from timers.listener.finding.claimer import Claimer, ClaimerHooks
    from timers.listener.finding.due_tracker import DueTracker
    from timers.listener.flow.gate import FlowGate
    from timers.listener.flow.parker import Parker
    from timers.listener.retrying import Outage
    from timers.model.clock import SystemClock
    from timers.model.runs import Run
    from timers.store.script_rows import NewTimer

    async def scenario() -> tuple[list[int], list[str], int]:
        fake = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        scripts = Scripts(fake, KS)
        seconds, micros = await fake.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        await scripts.schedule([NewTimer(f"t{i:02}", "a.b:[]", "at", now - 1000 + i, "n")
                                for i in range(30)])
        script = scripts.script("claim")
        script.runner = counting = _AsyncCounting(script.runner)
        started: list[Run] = []
        hooks = ClaimerHooks(free_slots=lambda: 5, take_event_ids=lambda n: [],
                             busy=lambda: False, start=started.append,
                             give_up=lambda exc: None, keyed_tasks=lambda: ())
        flow = FlowGate(scripts, 5.0, on_held=lambda n: None, shards=1, shard=0)
        clock = SystemClock()
        claimer = Claimer(scripts, ("default",), "h:1:x", 5.0, clock, DueTracker(clock),
                          hooks, asyncio.Event(), poke=asyncio.Event(),
                          parker=Parker(scripts, ("default",), 5.0, lambda task: print,
                                        flow),
                          ahead_share=5, outage=Outage())
        calls = []
        for _ in range(6):
            before = counting.calls
            assert await claimer.claim(5) == 5
            calls.append(counting.calls - before)
        await fake.aclose()
        return calls, [run.escaped_id for run in started], len(claimer.known.keys)

    calls, ids, known = asyncio.run(scenario())
    assert calls == [2, 1, 1, 1, 1, 1]
    assert ids == [f"t{i:02}" for i in range(30)]
    assert known == 0  # every timer whose key it was given is claimed: none is kept


def test_a_lane_keeps_the_window_a_wider_claim_asked_for_through_narrower_claims() -> None:
    """A claim of few timers (a slot or two free) after one of many still passes the whole
    window that one asked for: cut to its own size it would drop the window's head, which
    it needs, and ask for it again, claim after claim."""
    from timers.listener.finding.claimer import KnownKeys

    known = KnownKeys()
    window = [f"{KS.timer_key_start}t{i:03}:a.b:[]".encode() for i in range(2 * 16 + 100)]
    known.learn(window, KS.timer_key_start, [], 16)
    known.learn([], KS.timer_key_start, [], 1)
    assert list(known.keys) == [key.decode() for key in window]
    known.learn([b"k:more"], KS.timer_key_start, [], 1)  # a narrower claim that asked
    assert len(known.keys) == KnownKeys.most(1)
    assert list(known.keys)[-1] == "k:more"  # the oldest asked go first
