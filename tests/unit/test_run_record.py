"""One codec for the run record (``P|runrec``) and a record's options, and the Lua that
reads the same formats spelling them the same way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from tests.unit.helpers import claim
from timers import Timers
from timers.model import run_record
from timers.model.encoding import Record, escape_id
from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.model.wire import Option

LUA = Path(run_record.__file__).parents[1] / "store" / "lua"


def lua_sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(LUA.glob("*.lua"))}


def test_a_run_record_decodes_to_what_it_was_encoded_from() -> None:
    record = Record("mod.task", [1, "a:b|c"], {Option.GROUP: "g", Option.WAITED_FROM: "5"})
    text = run_record.encode(2, "host:1:abc", 1767261600000, escape_id("id:1"), record.encode())
    assert text == "2@host:1:abc|1767261600000|id%3A1:mod.task;g=g;w=5:[1,\"a:b|c\"]"
    assert run_record.decode(text) == (2, "host:1:abc", 1767261600000, "id%3A1",
                                       record.encode())
    assert run_record.decode("0|5|x:t:") == (0, "", 5, "x", "t:")  # no listener named
    with pytest.raises(ValueError):
        run_record.decode("garbage")


def test_options_are_read_without_the_args_as_the_record_codec_reads_them() -> None:
    record = Record("a.b", {"k": ";w=9"}, {Option.WAITED_FROM: "12", Option.KEY: "dev%3A1"})
    text = record.encode()
    assert run_record.record_head(text) == ("a.b", ";k=dev%3A1;w=12")
    assert run_record.record_head("a.b:[1]") == ("a.b", "")
    for name, value in Record.decode(text).options.items():
        assert run_record.record_option(text, name) == value
    assert run_record.record_option(text, Option.GROUP) is None
    assert run_record.record_option("a.b:{\"x\":\";g=1\"}", Option.GROUP) is None


def test_what_claim_lua_writes_is_what_the_codec_reads(
        producer: Timers, scripts: dict[str, Any], ks: Keyspace,
        fake: fakeredis.FakeRedis) -> None:
    producer.schedule("a.b", [1], in_=0, id="x:1")
    (claimed,) = claim(scripts, ks, listener="host:1:abc").claimed
    stored = fake.hget(ks.running_records, claimed.token).decode()
    reruns, listener, due_ms, escaped, record = run_record.decode(stored)
    assert (reruns, listener, escaped, Record.decode(record).args) == (0, "host:1:abc",
                                                                        "x%3A1", [1])
    assert run_record.encode(reruns, listener, due_ms, escaped, record) == stored
    assert Run.parse(claimed.token, stored, "s").due_ms == due_ms


def test_the_lua_run_record_pattern_is_the_codecs() -> None:
    prelude = lua_sources()["prelude.lua"]
    assert f"string.match(run or '', {run_record.LUA_RUN_READ})" in prelude


def test_every_option_the_lua_reads_or_writes_is_an_option_spelt_the_same() -> None:
    """Each option letter in the scripts (``record_option(r, 'w')``, ``';w='``) is one of
    :data:`run_record.LUA_OPTIONS`, and each of those is used by some script."""
    used: dict[str, set[str]] = {}
    for name, text in lua_sources().items():
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        for letter in (re.findall(r"record_option\(\w+, '([a-z]+)'\)", code)
                       + re.findall(r"';([a-z]+)=", code)):
            used.setdefault(letter, set()).add(name)
    assert set(used) == {option.value for option in run_record.LUA_OPTIONS}, used
    assert {option.value for option in Option} >= set(used)
