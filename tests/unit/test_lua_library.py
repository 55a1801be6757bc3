"""The scripts as one function library (timers/store/lua_library.py): the same replies as by
EVALSHA, state that lives one call only, a lost library loaded again, EVALSHA where a
server refuses functions."""

from __future__ import annotations

import re
from importlib import resources

import fakeredis
import pytest
import redis

from timers import Timers
from timers.model.keys import Keyspace
from timers.store.lua_library import Function, library, state_resets
from timers.store.lua_source import PRELUDES, script_library
from timers.store.script_manifest import SCRIPT_NAMES
from timers.store.script_modes import EVAL_ONLY_ENV
from timers.store.scripts import Scripts


def _helpers() -> str:
    return "".join(resources.files("timers.store").joinpath("lua", f"{name}.lua").read_text("utf-8")
                   for name in PRELUDES)


def test_every_per_call_variable_of_the_helpers_is_set_back_at_each_call() -> None:
    top_level = re.findall(r"^local ([A-Za-z_]\w*) = ", _helpers(), re.MULTILINE)
    state = [name for name in top_level if not name.isupper()]
    assert state, "the helpers keep per-call state (index_heads, taker …)"
    resets = state_resets(_helpers())
    for name in state:
        assert re.search(rf"^{name} = ", resets, re.MULTILINE), name
    for name in (n for n in top_level if n.isupper()):  # constants stay as loaded
        assert not re.search(rf"^{name} = ", resets, re.MULTILINE), name


def test_state_a_call_leaves_is_gone_at_the_next() -> None:
    helpers = "local seen = {}\nlocal LIMIT = 3\n"
    body = "#!lua\nseen[#seen + 1] = ARGV[1]\nreturn {#seen, KEYS[1], LIMIT}\n"
    name, code = library(helpers, (("count", body),))
    fake = fakeredis.FakeRedis()
    fake.function_load(code)
    assert fake.fcall(f"{name}_count", 1, "k1", "a") == [1, b"k1", 3]
    assert fake.fcall(f"{name}_count", 1, "k2", "b") == [1, b"k2", 3]


def test_each_release_calls_its_own_functions() -> None:
    one = library("", (("s", "#!lua\nreturn 1\n"),))
    two = library("", (("s", "#!lua\nreturn 2\n"),))
    assert one[0] != two[0]
    fake = fakeredis.FakeRedis()
    fake.function_load(one[1])
    fake.function_load(two[1])
    assert (fake.fcall(f"{one[0]}_s", 0), fake.fcall(f"{two[0]}_s", 0)) == (1, 2)


def test_every_script_is_a_function_with_its_shebang_flags() -> None:
    name, code = script_library()
    for script in SCRIPT_NAMES:
        raw = resources.files("timers.store").joinpath("lua", f"{script}.lua").read_text("utf-8")
        flags = "{'allow-oom'}" if "flags=allow-oom" in raw.partition("\n")[0] else "{}"
        assert f"function_name = '{name}_{script}', flags = {flags}," in code


def test_a_server_that_lost_the_library_gets_it_again() -> None:
    fake = fakeredis.FakeRedis()
    with Timers(fake) as producer:
        producer.schedule("a.b", [1], in_=60, id="one")
        assert fake.function_list()
        fake.function_flush()
        producer.schedule("a.b", [2], in_=60, id="two")
        assert fake.function_list()
        assert {t.id for t in producer.list()} == {"one", "two"}


def test_the_same_replies_by_function_and_by_evalsha(monkeypatch: pytest.MonkeyPatch) -> None:
    replies = []
    for eval_only in ("0", "1"):
        monkeypatch.setenv(EVAL_ONLY_ENV, eval_only)
        fake = fakeredis.FakeRedis()
        scripts = Scripts(fake, Keyspace())
        claim = scripts.script("claim").runner  # (on fakeredis it declares its keys)
        assert isinstance(claim, Function) == (eval_only == "0")
        with Timers(fake) as producer:
            producer.schedule("a.b", [1], in_=-1, id="due")
        reply = scripts.claim(limit=5, lease_ms=1000, horizon_ms=0, listener_id="me")
        run = reply[4].decode().split("|")
        assert int(reply[3]) > 0  # the run token (drawn from the Redis clock too)
        replies.append([reply[1], run[0], run[2], reply[5]])  # not the times
        assert fake.function_list() if eval_only == "0" else not fake.function_list()
    assert replies[0] == replies[1]


class _Refusing(fakeredis.FakeRedis):
    """A server whose ACL refuses FUNCTION and FCALL (as a user without them meets)."""

    def function_load(self, *args: object, **kwargs: object) -> object:
        raise redis.exceptions.NoPermissionError(
            "this user has no permissions to run the 'function|load' command")


def test_a_server_that_refuses_functions_runs_the_scripts_by_evalsha() -> None:
    fake = _Refusing()
    with Timers(fake) as producer:
        producer.schedule("a.b", [1], in_=60, id="one")
        producer.schedule("a.b", [2], in_=60, id="two")
        assert {t.id for t in producer.list()} == {"one", "two"}


class _CountingLoads(fakeredis.FakeRedis):
    loads = 0

    def function_load(self, *args: object, **kwargs: object) -> object:
        type(self).loads += 1
        return super().function_load(*args, **kwargs)


def test_the_library_is_loaded_once_per_server_not_once_per_client() -> None:
    # loading blocks the server for some 10 ms: a web app's every worker, a listener's
    # every start, would each pay it again
    server = fakeredis.FakeServer()
    for n in range(3):
        with Timers(_CountingLoads(server=server)) as producer:
            producer.schedule("a.b", [n], in_=60, id=f"t{n}")
    assert _CountingLoads.loads == 1
    with Timers(_CountingLoads(server=server)) as producer:
        assert {t.id for t in producer.list()} == {"t0", "t1", "t2"}
