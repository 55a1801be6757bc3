"""The run record: how ``P|runrec`` keeps a claimed run, and a record's options read fast.

A run record is ``<reruns>@<listener>|<due ms>|<escaped id>:<record>``: the runs of the
timer cut short by a crash before this one, the listener that claimed it (no ``|``), the
due time of this run, the timer id (escaped: no ``:``, see :func:`timers.model.encoding.escape_id`)
and its stored record ``task[;opt=value…]:args`` (:class:`timers.model.encoding.Record`, whose
options are the :class:`timers.model.wire.Option` letters). ``claim.lua`` writes it, a claim
reply and a batch of endings' reply carry it, and every Python reader decodes it here
(:func:`decode`); the scripts read it with the prelude's ``run_read``, whose pattern is
:data:`LUA_RUN_READ` (a test checks they agree).

A record's options are read here without decoding its args (:func:`record_option`), the
way the prelude's ``record_option`` reads them in Lua; the options the scripts read or
write are :data:`LUA_OPTIONS` (a test checks each appears, spelt the same, in the Lua that
reads it, and that no other does).
"""

from __future__ import annotations

from timers.model.wire import Option

RunFields = tuple[int, str, int, str, str]
"""A decoded run record: (reruns, listener, due ms, escaped id, record)."""

LUA_RUN_READ = "'^(%d+)@?([^|]*)|(%-?%d+)|([^:]+):(.*)$'"
"""The Lua pattern of ``run_read`` in ``lua/prelude.lua``: the same fields, in order."""

LUA_OPTIONS = frozenset({Option.GROUP, Option.PRIORITY, Option.KEY, Option.WAITED_FROM,
                         Option.RERUNS})
"""The record options the scripts read or write (``lua/*.lua``)."""


def encode(reruns: int, listener: str, due_ms: int, escaped_id: str, record: str) -> str:
    """A run record, as ``claim.lua`` writes it (``listener`` must hold no ``|``)."""
    return f"{reruns}@{listener}|{due_ms}|{escaped_id}:{record}"


def decode(text: str) -> RunFields:
    """(reruns, listener, due ms, escaped id, record) of a run record; :class:`ValueError`
    if it has not that form. On the claim path: no more than the splits it needs."""
    head, due, entry = text.split("|", 2)
    escaped, _, record = entry.partition(":")
    reruns, _, listener = head.partition("@")
    return int(reruns), listener, int(due), escaped, record


def record_head(record: str) -> tuple[str, str]:
    """(task, options) of a record ``task[;opt=value…]:args``, its args unread; options
    is ``""`` or ``";opt=value…"``."""
    head = record.partition(":")[0]
    split = head.find(";")
    return (head, "") if split < 0 else (head[:split], head[split:])


def record_option(record: str, name: str) -> str | None:
    """The value of option ``name`` in a record (its first), or None; its args unread."""
    for option in record.partition(":")[0].split(";")[1:]:
        key, _, value = option.partition("=")
        if key == name:
            return value
    return None


def with_options(record: str, **options: str) -> str:
    """``record`` with each of ``options`` set (replacing its value if present), its
    other options and its args text unchanged."""
    head, colon, args = record.partition(":")
    parts = head.split(";")
    kept = [p for p in parts[1:] if p.partition("=")[0] not in options]
    added = [f"{name}={value}" for name, value in options.items()]
    return ";".join([parts[0], *kept, *added]) + colon + args
