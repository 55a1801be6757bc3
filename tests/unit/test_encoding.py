"""Key-name encoding: every timer id and every JSON args survive the trip through a key name,
and anything that does not decode exactly is refused as malformed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timers.exceptions import (
    InvalidArgs,
    InvalidTask,
    InvalidTimer,
    InvalidTimerId,
    MalformedTimerKey,
)
from timers.model.encoding import (
    DEFAULT_MAX_ARGS_BYTES,
    MAX_TASK_LENGTH,
    Entry,
    Record,
    as_text,
    check_id,
    check_task,
    encode_args,
    entry_text,
    escape_id,
    unescape_id,
)
from timers.model.keys import Keyspace

# Characters that mean something somewhere in a key, a record or a JSON text.
TRICKY = ':;|%"\\\n\r\t{}[],= \x00/.'
tricky_text = st.text(
    alphabet=st.one_of(st.sampled_from(TRICKY), st.characters(codec="utf-8")), max_size=30
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    tricky_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(tricky_text, children, max_size=5),
    max_leaves=25,
)
json_args = st.one_of(
    st.none(),
    st.lists(json_values, max_size=6),
    st.dictionaries(tricky_text, json_values, max_size=6),
)
timer_ids = st.text(
    alphabet=st.one_of(st.sampled_from(":%3A25"), st.characters(codec="utf-8")),
    min_size=1,
    max_size=40,
)
task_paths = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}(\.[A-Za-z][A-Za-z0-9_]{0,8}){0,3}",
                           fullmatch=True)


def decode_key(key: str, keyspace: Keyspace) -> Entry:
    """What a listener does with an expired key name it received as bytes."""
    raw = key.encode("utf-8")
    start = keyspace.timer_key_start.encode()
    assert raw.startswith(start)
    return Entry.decode(as_text(raw[len(start):]))


# -- ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "timer_id", ["plain", "a:b", "%", "%3A", "%25", ":%:", "::", "100%:done", "é:😀"]
)
def test_escape_round_trips_and_hides_colons(timer_id: str) -> None:
    escaped = escape_id(timer_id)
    assert ":" not in escaped
    assert unescape_id(escaped) == timer_id


@given(timer_ids)
def test_any_id_round_trips(timer_id: str) -> None:
    escaped = escape_id(timer_id)
    assert ":" not in escaped
    assert unescape_id(escaped) == timer_id


@given(timer_ids, timer_ids)
def test_distinct_ids_escape_to_distinct_names(a: str, b: str) -> None:
    if a != b:
        assert escape_id(a) != escape_id(b)


@pytest.mark.parametrize("escaped", ["%zz", "50%", "%3", "%2", "a%3a", "a:b", "%%"])
def test_bad_escapes_are_malformed(escaped: str) -> None:
    with pytest.raises(MalformedTimerKey):
        unescape_id(escaped)


@pytest.mark.parametrize(
    ("bad", "words"),
    [("", "empty"), (42, "int"), (None, "NoneType"), ("x" * 513, "512 bytes"),
     ("\ud800", "unicode")],
)
def test_check_id_refuses(bad: object, words: str) -> None:
    with pytest.raises(InvalidTimerId, match=words):
        check_id(bad)


# -- the whole key -----------------------------------------------------------------------


@settings(max_examples=300)
@given(timer_ids, task_paths, json_args)
def test_key_name_round_trips_any_id_task_and_json_args(
    timer_id: str, task: str, args: Any
) -> None:
    keyspace = Keyspace()
    record = Record(task, args)
    key = keyspace.timer_key(entry_text(escape_id(timer_id), record.encode()))
    assert decode_key(key, keyspace) == Entry(timer_id, record)


@given(timer_ids, json_args)
def test_key_name_round_trips_under_another_prefix(timer_id: str, args: Any) -> None:
    keyspace = Keyspace("app1")
    record = Record("reminders.sms", args, {"a": "3"})
    key = keyspace.timer_key(entry_text(escape_id(timer_id), record.encode()))
    entry = decode_key(key, keyspace)
    assert entry == Entry(timer_id, record)
    assert entry.record.options == {"a": "3"}


def test_args_full_of_separators_round_trip() -> None:
    args = {
        "a:b": "c:d",
        "semi;colon": ";;",
        "pipe|": "x|y|z",
        "pct%": "%3A%25%zz",
        "quote\"back\\slash": "line\nbreak\r\ttab",
        "emoji": "😀👍🏽",
        "nested": [{"k:": [":", ";", "|", "%"]}, None, True, 1.5, -3],
        "": "",
    }
    keyspace = Keyspace()
    key = keyspace.timer_key(
        entry_text(escape_id("id:%with:colons"), Record("jobs.run", args).encode())
    )
    entry = decode_key(key, keyspace)
    assert entry.id == "id:%with:colons"
    assert entry.record.task == "jobs.run"
    assert entry.record.args == args


def test_record_text_layout() -> None:
    assert Record("reminders.sms", {"user_id": 42}).encode() == 'reminders.sms:{"user_id":42}'
    assert Record("reminders.sms").encode() == "reminders.sms:"
    assert Record("a.b", [1], {"a": "2", "b": "x"}).encode() == "a.b;a=2;b=x:[1]"
    assert Record.decode("a.b;a=2:[1]") == Record("a.b", [1], {"a": "2"})
    assert Record.decode("a.b:") == Record("a.b", None)


def test_unicode_args_are_stored_as_text_not_escapes() -> None:
    assert Record("a.b", ["é😀"]).encode() == 'a.b:["é😀"]'


def test_entry_decode_splits_at_the_first_two_colons() -> None:
    entry = Entry.decode('x%3Ay:jobs.run:{"url":"http://h:80/a:b"}')
    assert entry.id == "x:y"
    assert entry.record == Record("jobs.run", {"url": "http://h:80/a:b"})


@pytest.mark.parametrize(
    "option", [{"A": "1"}, {"toolongkey": "1"}, {"a": "has space"}, {"a": "x:y"}, {"a": "x;y"}]
)
def test_bad_options_are_refused_when_encoding(option: dict[str, str]) -> None:
    with pytest.raises(InvalidTimer, match="option"):
        Record("a.b", None, option).encode()


# -- malformed input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "no-colon-at-all",
        ":a.b:[]",  # empty id
        "%zz:a.b:[]",  # bad escape
        "id:a.b",  # no ':' between task and args
        "id:a.b:5",  # args that are a number
        'id:a.b:"text"',  # a string
        "id:a.b:null",  # null
        "id:a.b:true",
        "id:a.b:[1",  # not JSON
        "id:a.b:[1]x",
        "id::[]",  # empty task
        "id:..:[]",
        "id:a..b:[]",
        "id:__import__:[]",
        "id:os..system:[]",
        "id:_private:[]",
        "id:mod._private:[]",
        "id:mod.__call__:[]",
        "id:1abc:[]",
        "id:mod.1abc:[]",
        "id:a/b:[]",
        "id:a.b.:[]",
        "id:.a.b:[]",
        "id:a b:[]",
        "id:a.b;:[]",  # empty option
        "id:a.b;a:[]",  # option without '='
        "id:a.b;A=1:[]",  # option key not lower-case
        "id:a.b;a=x y:[]",  # bad option value
        "id:" + "a" * (MAX_TASK_LENGTH + 1) + ":[]",
    ],
)
def test_malformed_entries_raise(text: str) -> None:
    with pytest.raises(MalformedTimerKey):
        Entry.decode(text)


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"timers:\xc3(:a.b:[]", b"abc\xed\xa0\x80"])
def test_invalid_utf8_is_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedTimerKey, match="UTF-8"):
        as_text(raw)


def test_as_text_passes_valid_text_through() -> None:
    assert as_text("timers:x:a.b:[]") == "timers:x:a.b:[]"
    assert as_text("é:😀".encode()) == "é:😀"


@pytest.mark.parametrize(
    "task", ["..", "__import__", "os..system", "_private", "1abc", "a.", "", "a-b", "é"]
)
def test_check_task_refuses_non_paths(task: str) -> None:
    with pytest.raises(InvalidTask, match=r"dotted path"):
        check_task(task)


def test_check_task_refuses_non_strings() -> None:
    with pytest.raises(InvalidTask, match="int"):
        check_task(5)


def test_check_task_length_limit() -> None:
    assert check_task("a" * MAX_TASK_LENGTH) == "a" * MAX_TASK_LENGTH
    with pytest.raises(InvalidTask):
        check_task("a" * (MAX_TASK_LENGTH + 1))


# -- args validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "type_name"), [(5, "int"), ("abc", "str"), (1.5, "float"), (b"x", "bytes"),
                            ({1, 2}, "set"), (True, "bool")],
)
def test_args_that_are_not_list_or_dict_are_refused_by_type(args: object, type_name: str) -> None:
    with pytest.raises(InvalidArgs, match=type_name):
        encode_args(args)


@pytest.mark.parametrize(
    "args",
    [[{1, 2}], [object()], [float("nan")], {"x": float("inf")}, [b"bytes"], [1 + 2j]],
)
def test_args_that_are_not_json_are_refused(args: object) -> None:
    with pytest.raises(InvalidArgs, match="JSON"):
        encode_args(args)


def test_dict_args_need_string_keys() -> None:
    with pytest.raises(InvalidArgs, match="string keys"):
        encode_args({1: "a"})
    with pytest.raises(InvalidArgs, match="string keys"):
        encode_args({"ok": 1, None: 2})


def test_args_with_lone_surrogates_are_refused() -> None:
    with pytest.raises(InvalidArgs, match="unicode"):
        encode_args(["\udc80"])


def test_args_over_the_limit_name_size_and_limit() -> None:
    args = ["x" * 200]
    size = len(json.dumps(args))
    with pytest.raises(InvalidArgs, match=rf"{size} bytes.*limit of 100"):
        encode_args(args, max_bytes=100)


def test_args_limit_counts_utf8_bytes_not_characters() -> None:
    args = ["😀" * 30]  # 34 characters of JSON, 124 bytes
    assert len(json.dumps(args, ensure_ascii=False)) < 100
    with pytest.raises(InvalidArgs, match="124 bytes"):
        encode_args(args, max_bytes=100)
    assert encode_args(args, max_bytes=124) == json.dumps(args, ensure_ascii=False)


def test_args_at_default_limit_pass_and_one_more_byte_fails() -> None:
    fits = ["x" * (DEFAULT_MAX_ARGS_BYTES - 4)]
    assert len(encode_args(fits)) == DEFAULT_MAX_ARGS_BYTES
    with pytest.raises(InvalidArgs):
        encode_args(["x" * (DEFAULT_MAX_ARGS_BYTES - 3)])


def test_tuple_args_are_a_list() -> None:
    assert encode_args((1, "a", None)) == '[1,"a",null]'
    assert Record.decode(Record("a.b", (1, 2)).encode()).args == [1, 2]  # type: ignore[arg-type]


def test_no_args_is_empty() -> None:
    assert encode_args(None) == ""
    assert encode_args([]) == "[]"
    assert encode_args({}) == "{}"


@pytest.mark.parametrize("shape", ["list", "dict"])
def test_args_nested_ten_thousand_deep_are_invalid_args_not_a_recursion_error(
    shape: str,
) -> None:
    """Issue 9 row 14: this raised RecursionError."""
    args: Any = [] if shape == "list" else {}
    for _ in range(10_000):
        args = [args] if shape == "list" else {"a": args}
    with pytest.raises(InvalidArgs, match="nested too deeply"):
        encode_args(args)
