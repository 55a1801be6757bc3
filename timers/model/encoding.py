"""How a timer is written into names and records, and read back from untrusted bytes.

A timer is stored as a *record* ``task[;opt=value…]:args`` where ``args`` is compact JSON
(empty for no args). Its expiring key is ``<prefix>:<id>:<record>``; the part after the
prefix, ``<id>:<record>``, is the *entry*. The id is escaped (``%`` → ``%25``, ``:`` →
``%3A``) so an entry always splits at its first two colons: the task path and the options
never contain one, and the JSON args, which may, come last.

Everything that reads an entry treats it as data from the network: anything that does not
decode exactly raises :class:`MalformedTimerKey`.
"""

from __future__ import annotations

import functools
import json
import json.scanner
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from timers.exceptions import (
    InvalidArgs,
    InvalidTask,
    InvalidTimer,
    InvalidTimerId,
    MalformedTimerKey,
)
from timers.model.fast_init import fast_init

MAX_TASK_LENGTH = 200
MAX_ID_BYTES = 512
DEFAULT_MAX_ARGS_BYTES = 64 * 1024

# Each segment starts with a letter: no dunders, no private names, no "..", no "/".
_TASK_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z][A-Za-z0-9_]*)*")
_OPT_KEY_RE = re.compile(r"[a-z]{1,8}")
_OPT_VALUE_RE = re.compile(r"[A-Za-z0-9_.%+-]{0,200}")
_ESCAPE_RE = re.compile(r"%(?!25|3A)")

Args = list[Any] | dict[str, Any] | None
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_JSON_SETTINGS = (_ENCODER.default, encode_basestring, None, _ENCODER.key_separator,
                  _ENCODER.item_separator, False, False, False)
"""``_ENCODER``'s settings as json's C encoder takes them (after its circular-reference
``markers``): :func:`encode_args` makes that encoder itself, as ``_ENCODER.encode`` does
on each call, without its two Python frames, which showed in every schedule's CPU
(figures: bench/FINDINGS.md, "A schedule's client CPU per timer")."""


# (typeshed wants a scanner for the context where json passes its decoder: its own TODO)
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
"""json.loads's own scanner (the C one), as it reads a document with no whitespace
around it: ``(value, end)``, or StopIteration when none starts at the index."""


def escape_id(timer_id: str) -> str:
    """The form of a timer id used inside Redis: no ``:`` in it."""
    return timer_id.replace("%", "%25").replace(":", "%3A")


def unescape_id(escaped: str) -> str:
    """The timer id ``escaped`` stands for; :class:`MalformedTimerKey` for a bad escape."""
    if "%" not in escaped:  # most ids: nothing escaped (read twice per run)
        if ":" in escaped:
            raise MalformedTimerKey(f"bad escape in timer id {escaped!r}")
        return escaped
    if ":" in escaped or _ESCAPE_RE.search(escaped):
        raise MalformedTimerKey(f"bad escape in timer id {escaped!r}")
    return escaped.replace("%3A", ":").replace("%25", "%")


def check_id(timer_id: object) -> str:
    """Validate a caller-chosen timer id and return it."""
    if not isinstance(timer_id, str):
        raise InvalidTimerId(f"timer id must be a string, got {type(timer_id).__name__}")
    if not timer_id:
        raise InvalidTimerId("timer id must not be empty")
    if len(timer_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise InvalidTimerId(f"timer id is longer than {MAX_ID_BYTES} bytes")
    try:
        timer_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTimerId(f"timer id is not valid unicode text: {exc}") from None
    return timer_id


def is_occurrence_id(timer_id: str) -> bool:
    """Whether ``timer_id`` has the form ``<name>@<digits>`` of an occurrence of a
    recurrence (see :mod:`timers.model.cron`)."""
    head, sep, tail = timer_id.rpartition("@")
    return bool(sep and head and tail) and tail.isdigit()


def check_user_id(timer_id: object) -> str:
    """Validate an id a caller chose for a new timer: :func:`check_id`, and not of the
    occurrence form, which is reserved (scheduling ``daily@1767261600000`` would replace
    the pending occurrence of the recurrence ``daily`` and end its chain)."""
    checked = check_id(timer_id)
    if is_occurrence_id(checked):
        raise InvalidTimerId(
            f"timer id {checked!r} has the form <name>@<digits> reserved for the "
            f"occurrences of recurrences: choose an id that does not end in '@' and digits"
        )
    return checked


@functools.lru_cache(maxsize=4096)
def is_task_path(task: str) -> bool:
    return len(task) <= MAX_TASK_LENGTH and _TASK_RE.fullmatch(task) is not None


def check_task(task: object) -> str:
    """Validate a dotted task path such as ``reminders.sms`` and return it."""
    if not isinstance(task, str):
        raise InvalidTask(f"task must be a dotted path string, got {type(task).__name__}")
    if not is_task_path(task):
        raise InvalidTask(
            f"task {task!r} is not a dotted path of names that start with a letter "
            f"(e.g. 'reminders.sms'), at most {MAX_TASK_LENGTH} characters"
        )
    return task


def encode_args(args: object, max_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> str:
    """Compact JSON for ``args`` (a list, tuple, dict with str keys, or None)."""
    kind = type(args)
    if kind is not dict and kind is not list:  # (most args are one of the two)
        if args is None:
            return ""
        if isinstance(args, tuple):
            args = list(args)
        if not isinstance(args, list | dict):
            raise InvalidArgs(
                f"args must be a list (positional), a dict (keyword) or None, "
                f"got {type(args).__name__}"
            )
    if isinstance(args, dict):
        for k in args:
            if not isinstance(k, str):
                raise InvalidArgs(f"keyword args need string keys, got {k!r}")
    try:
        if c_make_encoder is None:  # pragma: no cover - CPython has it
            text = _ENCODER.encode(args)
        else:
            text = "".join(c_make_encoder({}, *_JSON_SETTINGS)(args, 0))
    except (TypeError, ValueError) as exc:
        raise InvalidArgs(f"args must be JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidArgs("args are nested too deeply to encode as JSON") from None
    if text.isascii():  # (a flag of the string: most args are ASCII)
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidArgs(f"args hold text that is not valid unicode: {exc}") from None
    if size > max_bytes:
        raise InvalidArgs(f"args are {size} bytes as JSON, over the limit of {max_bytes}")
    return text


def decode_args(text: str) -> Args:
    """The args of a record's JSON text (``""``: None); :class:`MalformedTimerKey` if it is
    not a JSON list or object."""
    if text == "":
        return None
    try:
        try:  # the scanner alone: json.loads's two frames and two regex matches less
            value, end = _SCAN(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):  # whitespace around it, or not JSON: json.loads says which
            value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise MalformedTimerKey(f"args are not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, list | dict):
        raise MalformedTimerKey(f"args must be a JSON list or object, got {type(value).__name__}")
    return value


def encode_record(task: str, args: Args, options: Mapping[str, str],
                  max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> str:
    """A record ``task[;key=value…]:args`` (:meth:`Record.encode`, without making the
    :class:`Record`), each part checked."""
    head = check_task(task)
    if options:
        for key, value in sorted(options.items()):
            if not _OPT_KEY_RE.fullmatch(key) or not _OPT_VALUE_RE.fullmatch(value):
                raise InvalidTimer(f"bad timer option {key}={value!r}")
            head += f";{key}={value}"
    return head + ":" + encode_args(args, max_args_bytes)


@fast_init  # made once or more per run
@dataclass(frozen=True)
class Record:
    """What a timer runs: a task path, its args, and small options (e.g. attempts so far)."""

    task: str
    args: Args = None
    options: dict[str, str] = field(default_factory=dict)

    def encode(self, max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> str:
        return encode_record(self.task, self.args, self.options, max_args_bytes)

    @classmethod
    def decode(cls, text: str) -> Record:
        head, sep, args_text = text.partition(":")
        if not sep:
            raise MalformedTimerKey(f"record has no ':' between task and args: {text[:80]!r}")
        task, *opts = head.split(";")
        if not is_task_path(task):
            raise MalformedTimerKey(f"not a task path: {task[:80]!r}")
        options: dict[str, str] = {}
        for opt in opts:
            key, eq, value = opt.partition("=")
            if not eq or not _OPT_KEY_RE.fullmatch(key) or not _OPT_VALUE_RE.fullmatch(value):
                raise MalformedTimerKey(f"bad timer option {opt[:80]!r}")
            options[key] = value
        return cls(task, decode_args(args_text), options)


@dataclass(frozen=True)
class Entry:
    """A timer id with its record: the part of a timer key after the prefix."""

    id: str
    record: Record

    @classmethod
    def decode(cls, text: str) -> Entry:
        escaped, sep, record = text.partition(":")
        if not sep or not escaped:
            raise MalformedTimerKey(f"entry has no timer id: {text[:80]!r}")
        return cls(unescape_id(escaped), Record.decode(record))


def entry_text(escaped_id: str, record: str) -> str:
    return f"{escaped_id}:{record}"


def as_text(raw: bytes | str) -> str:
    """Decode bytes from Redis as UTF-8, refusing anything that is not."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedTimerKey(f"not valid UTF-8: {exc}") from None
