"""Group names, priorities and concurrency keys: the errors a user reads, and the escaped
form a key takes in a record."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timers.exceptions import InvalidTimer, MalformedTimerKey
from timers.model.encoding import Record
from timers.model.flow.names import (
    DEFAULT_GROUP,
    GROUP_ENV,
    check_group,
    check_key,
    check_priority,
    configured_group,
    escape_key,
    unescape_key,
)


@pytest.mark.parametrize("name", ["default", "video", "a", "A-b_c.9", "x" * 64])
def test_good_group_names_are_kept(name: str) -> None:
    assert check_group(name) == name


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "group '' must be 1 to 64 letters, digits, '_', '.' or '-'"),
        ("a b", "group 'a b' must be 1 to 64 letters, digits, '_', '.' or '-'"),
        ("x" * 65, f"group '{'x' * 65}' must be 1 to 64 letters, digits, '_', '.' or '-'"),
        ("vidéo", "group 'vidéo' must be 1 to 64 letters, digits, '_', '.' or '-'"),
        ("a:b", "group 'a:b' must be 1 to 64 letters, digits, '_', '.' or '-'"),
        (7, "group must be a string, got int"),
    ],
)
def test_a_bad_group_is_refused_in_one_line(value: object, message: str) -> None:
    with pytest.raises(InvalidTimer) as err:
        check_group(value)
    assert str(err.value) == message
    assert isinstance(err.value, ValueError)


def test_the_configured_group_is_the_given_one_then_the_environment_then_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GROUP_ENV, raising=False)
    assert configured_group() == DEFAULT_GROUP == "default"
    monkeypatch.setenv(GROUP_ENV, "video")
    assert configured_group() == "video"
    assert configured_group("mail") == "mail"


def test_a_bad_group_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(GROUP_ENV, "video nodes")
    with pytest.raises(InvalidTimer) as err:
        configured_group()
    assert str(err.value) == (
        "$TIMERS_GROUP 'video nodes' must be 1 to 64 letters, digits, '_', '.' or '-'"
    )


@pytest.mark.parametrize("value", [-1000, -1, 0, 1, 1000])
def test_priorities_in_range_are_kept(value: int) -> None:
    assert check_priority(value) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1001, "priority must be from -1000 to 1000, got 1001"),
        (-1001, "priority must be from -1000 to 1000, got -1001"),
        (True, "priority must be an integer, got bool"),
        (1.5, "priority must be an integer, got float"),
        ("5", "priority must be an integer, got str"),
    ],
)
def test_a_bad_priority_is_refused_in_one_line(value: object, message: str) -> None:
    with pytest.raises(InvalidTimer) as err:
        check_priority(value)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "concurrency key must be 1 to 200 characters, got 0"),
        ("k" * 201, "concurrency key must be 1 to 200 characters, got 201"),
        ("a\nb", "concurrency key 'a\\nb' holds a control character (U+000A)"),
        ("a\x00", "concurrency key 'a\\x00' holds a control character (U+0000)"),
        (7, "concurrency key must be a string, got int"),
        (None, "concurrency key must be a string, got NoneType"),
    ],
)
def test_a_bad_key_is_refused_in_one_line(value: object, message: str) -> None:
    with pytest.raises(InvalidTimer) as err:
        check_key(value)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("key", "escaped"),
    [
        ("device:7", "device%3A7"),
        ("user-42_a.b", "user-42_a.b"),
        ("100%", "100%25"),
        ("a b/c", "a%20b%2Fc"),
        ("é", "%C3%A9"),
        ("设备", "%E8%AE%BE%E5%A4%87"),
        ("a+b", "a%2Bb"),
    ],
)
def test_a_key_is_escaped_to_fit_a_record_option_and_read_back(key: str, escaped: str) -> None:
    assert escape_key(key) == escaped
    assert unescape_key(escaped) == key
    record = Record("a.b", None, {"k": escaped})
    assert Record.decode(record.encode()).options["k"] == escaped


def test_a_key_too_long_once_escaped_is_refused() -> None:
    assert escape_key("k" * 200) == "k" * 200
    with pytest.raises(InvalidTimer) as err:
        escape_key(":" * 67)
    assert str(err.value) == (
        "concurrency key too long once escaped: 201 characters, over 200 "
        "(each byte outside A-Z a-z 0-9 _ . - takes 3)"
    )


@pytest.mark.parametrize("text", ["%", "%3", "%3a", "%GG", "a:b", "a b", "%C3", "%FF"])
def test_a_bad_escape_does_not_read_as_a_key(text: str) -> None:
    with pytest.raises(MalformedTimerKey):
        unescape_key(text)


@given(st.text(min_size=1, max_size=60))
def test_every_key_survives_the_round_trip(key: str) -> None:
    try:
        escaped = escape_key(key)
    except InvalidTimer:
        return  # lone surrogates are not text that can be stored
    assert unescape_key(escaped) == key
