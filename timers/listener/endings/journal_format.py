"""The endings journal's files and lines (:mod:`timers.listener.endings.journal`): how a
journal file is named and locked, its text (up to its first NUL), and its lines, read back
from bytes another process wrote: a line that does not read is skipped.

Text: ``H <owner id, JSON>`` (first), ``O <lane> <token> <due ms> <escaped id>`` (a run
that completed), ``E <lane> <ending, JSON>`` (any other).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timers.listener.endings.ending import Ending
from timers.model.wire import EndingKind, FailureRecord

SUFFIX = ".endings"
ROTATING = ".rotating"
ADOPTED = ".adopted"
ASIDE = ".q"
"""A quarantine child's line that its run completed, in a file of its own beside its
listener's journal (``<journal file>.q<token>``,
:func:`~timers.listener.endings.journal.note_aside`): the child writes it before it tells
its listener, so a rerun finds it while that listener is paused or after it died, before
the listener journaled the ending itself."""
MAX_READ = 64 << 20
"""Bytes read of a journal at most (a live one stays near
:data:`~timers.listener.endings.journal.ROTATE_BYTES`)."""

_OK = EndingKind.OK
_KINDS = {kind.value: kind for kind in EndingKind if kind is not EndingKind.REJECT}
_REQUEUED = {EndingKind.RETRY, EndingKind.MOVE, EndingKind.WAIT}
_ENTRY = re.compile(r"[^:]+:[^:]+:")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_name(owner: str) -> str:
    """The journal file of listener ``owner`` (its id, ``host:pid:random``)."""
    return _UNSAFE.sub("_", owner)[:200] + SUFFIX


def open_locked(path: Path, flags: int) -> int:
    """A descriptor of ``path`` under this process's exclusive lock (an error if another
    process holds it)."""
    fd = os.open(path, flags | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(fd: int) -> bytes:
    """A journal's text: up to its first NUL (:data:`MAX_READ` bytes at most)."""
    chunks = []
    at = 0
    while at < MAX_READ:
        chunk = os.pread(fd, 1 << 16, at)
        end = chunk.find(b"\0")
        if end >= 0 or not chunk:
            chunks.append(chunk if end < 0 else chunk[:end])
            break
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


def completed_line(lane: int, token: str, escaped_id: str, due_ms: int) -> bytes | None:
    """The line of a run that completed; None when its id holds a line end or a NUL."""
    if "\n" in escaped_id or "\0" in escaped_id:
        return None
    try:
        return f"O {lane} {token} {due_ms} {escaped_id}\n".encode()
    except UnicodeEncodeError:
        return None


def ending_line(lane: int, ending: Ending) -> bytes:
    """The line of any ending (``E``)."""
    return b"E %d %s\n" % (lane, _encode(ending).encode())


@dataclass
class Contents:
    """What a journal file holds."""

    owner: str | None = None
    endings: dict[int, dict[str, Ending]] = field(default_factory=dict)
    """Lane -> run token -> its last ending, in the order first written."""
    skipped: int = 0
    """Lines that did not read (a torn last line, or damage)."""


def parse(data: bytes) -> Contents:
    """Read a journal's text; what does not read is skipped and counted."""
    contents = Contents()
    lines = data.split(b"\n")
    if lines[-1]:
        contents.skipped += 1  # torn: its process died in the middle of the write
    for number, line in enumerate(lines[:-1]):
        try:
            kind, _, rest = line.decode().partition(" ")
            if kind == "H" and number == 0:
                owner = json.loads(rest)
                if not isinstance(owner, str):
                    raise ValueError(owner)
                contents.owner = owner
            elif kind == "O":
                lane_text, token, due, escaped_id = rest.split(" ", 3)
                ending = _checked(Ending(token, _OK, run_of=(escaped_id, _count(due))))
                contents.endings.setdefault(_count(lane_text), {})[token] = ending
            elif kind == "E":
                lane_text, text = rest.split(" ", 1)
                ending = _checked(_decode(json.loads(text)))
                contents.endings.setdefault(_count(lane_text), {})[ending.token] = ending
            else:
                raise ValueError(kind)
        except (ValueError, TypeError, KeyError, AttributeError):
            contents.skipped += 1
    return contents


def _count(text: object) -> int:
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    if isinstance(text, str) and text.isascii() and text.isdigit():
        return int(text)
    raise ValueError(text)


def _encode(ending: Ending) -> str:
    return json.dumps({"t": ending.token, "k": ending.kind.value, "f": ending.failure_id,
                       "r": ending.failure.to_json() if ending.failure else None,
                       "e": ending.retry_entry, "d": ending.retry_delay_ms,
                       "o": list(ending.run_of) if ending.run_of else None,
                       "g": ending.grace_ms})


def _decode(data: dict[str, Any]) -> Ending:
    failure = data["r"]
    run_of = data["o"]
    if run_of is not None:
        escaped, due = run_of
        if not isinstance(escaped, str):
            raise ValueError(escaped)
        run_of = (escaped, _count(due))
    for name in ("t", "f", "e"):
        if not isinstance(data[name], str):
            raise ValueError(name)
    return Ending(data["t"], _KINDS[data["k"]], failure_id=data["f"],
                  failure=None if failure is None else FailureRecord.from_dict(
                      json.loads(failure)),
                  retry_entry=data["e"], retry_delay_ms=_count(data["d"]), run_of=run_of,
                  grace_ms=_count(data["g"]))


def _checked(ending: Ending) -> Ending:
    """``ending`` if ``finish.lua`` takes it (a bad one would fail the batch it is in)."""
    if not (ending.token.isascii() and ending.token.isdigit()):
        raise ValueError(ending.token)
    if ending.run_of is not None and (not ending.run_of[0] or ":" in ending.run_of[0]):
        raise ValueError(ending.run_of)
    kind = ending.kind
    if kind is EndingKind.FAIL and (not ending.failure_id or ending.failure is None):
        raise ValueError(kind)
    if kind in _REQUEUED and not _ENTRY.match(ending.retry_entry):
        raise ValueError(kind)
    return ending
