"""Group names, priorities and concurrency keys: checked, and escaped for the record.

A timer's record carries them as options (:class:`timers.model.wire.Option`): ``g=<group>``,
``p=<priority>`` and ``k=<escaped key>``. An option value may only hold
``[A-Za-z0-9_.%+-]``, so a key such as ``device:7`` is stored percent-escaped
(``device%3A7``); a group name is stored as it is, which is why it is restricted.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence

from timers.exceptions import InvalidTimer, MalformedTimerKey
from timers.model.keys import DEFAULT_GROUP as DEFAULT_GROUP

GROUP_ENV = "TIMERS_GROUP"
MAX_GROUP_LENGTH = 64
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
MAX_KEY_LENGTH = 200
TASK_KEY = "task:"
"""Start of the key (or rate limit name) of a task-wide limit: ``task:<path>``."""
"""Characters of a concurrency key, and also of its escaped form."""

_GROUP_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_ESCAPED_RE = re.compile(r"(?:[A-Za-z0-9_.-]|%[0-9A-F]{2})*")


def check_group(group: object, name: str = "group") -> str:
    """A group name (``[A-Za-z0-9_.-]``, 1 to 64 characters), else :class:`InvalidTimer`."""
    if not isinstance(group, str):
        raise InvalidTimer(f"{name} must be a string, got {type(group).__name__}")
    if not _GROUP_RE.fullmatch(group):
        raise InvalidTimer(
            f"{name} {group!r} must be 1 to {MAX_GROUP_LENGTH} letters, digits, '_', '.' or '-'"
        )
    return group


def configured_group(group: str | None = None) -> str:
    """``group`` if given, else ``$TIMERS_GROUP``, else ``default``; checked."""
    if group is not None:
        return check_group(group)
    from_env = os.environ.get(GROUP_ENV)
    if from_env is None:
        return DEFAULT_GROUP
    return check_group(from_env, f"${GROUP_ENV}")


def served_groups(groups: Sequence[str] | None = None) -> tuple[str, ...]:
    """The groups a listener serves, each checked, in the order given, without repeats:
    the ones it is given, else ``$TIMERS_GROUP``, else the default group. It claims only
    timers of those groups (invariant 9)."""
    if not groups:
        return (configured_group(),)
    if isinstance(groups, str):
        groups = [groups]
    return tuple(dict.fromkeys(check_group(group) for group in groups))


def check_priority(priority: object) -> int:
    """An int from -1000 to 1000 (higher runs first), else :class:`InvalidTimer`."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidTimer(f"priority must be an integer, got {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidTimer(
            f"priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority}"
        )
    return priority


def check_key(key: object) -> str:
    """A concurrency key: text of 1 to 200 characters with no control character."""
    if not isinstance(key, str):
        raise InvalidTimer(f"concurrency key must be a string, got {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise InvalidTimer(
            f"concurrency key must be 1 to {MAX_KEY_LENGTH} characters, got {len(key)}"
        )
    for char in key:
        if unicodedata.category(char) == "Cc":
            raise InvalidTimer(
                f"concurrency key {key!r} holds a control character (U+{ord(char):04X})"
            )
    return key


def escape_key(key: str) -> str:
    """``key`` as a record option value: each UTF-8 byte outside ``[A-Za-z0-9_.-]`` as
    ``%XX``. :class:`InvalidTimer` if that is over 200 characters."""
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTimer(f"concurrency key is not valid unicode text: {exc}") from None
    escaped = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)
    if len(escaped) > MAX_KEY_LENGTH:
        raise InvalidTimer(
            f"concurrency key too long once escaped: {len(escaped)} characters, "
            f"over {MAX_KEY_LENGTH} (each byte outside A-Z a-z 0-9 _ . - takes 3)"
        )
    return escaped


def unescape_key(text: str) -> str:
    """The key :func:`escape_key` escaped; :class:`MalformedTimerKey` if ``text`` is not
    exactly such an escaped form."""
    if not _ESCAPED_RE.fullmatch(text):
        raise MalformedTimerKey(f"bad escape in concurrency key {text[:80]!r}")
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            raw.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.append(ord(text[i]))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedTimerKey(f"concurrency key {text[:80]!r} is not UTF-8: {exc}") from None
