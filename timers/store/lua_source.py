"""The Lua source of the scripts in ``timers/store/lua``: each script as sent to Redis.

A script's file is its shebang and body; the shared helpers it uses are linked in from the
helper files (:data:`PRELUDES`), only those it uses, directly or through another helper
(:func:`helpers_for`), in the order the files define them. Its declare part (the keys it
asks for, ``lua/declare.lua``) is kept or cut out (:func:`source`). The shared keys each
script's code builds are read from it (:func:`shared_key_names`), so a call is given only
those. The same scripts make one function library (:func:`script_library`,
:mod:`timers.store.lua_library`).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Literal, NamedTuple

from timers.model.keys import SCRIPT_KEY_NAMES
from timers.store.lua_library import library

ScriptName = Literal[
    "schedule", "reschedule", "cancel", "claim", "renew", "finish", "heartbeat", "forget",
    "cron_declare", "cron_next", "cron_pause", "cron_remove", "gate", "park",
    "near", "shards", "move", "arrive", "depart", "trim",
]
SCRIPT_NAMES: tuple[ScriptName, ...] = (
    "schedule",
    "reschedule",
    "cancel",
    "claim",
    "renew",
    "finish",
    "heartbeat",
    "forget",
    "cron_declare",
    "cron_next",
    "cron_pause",
    "cron_remove",
    "gate",
    "park",
    "near",
    "shards",
    "move",
    "arrive",
    "depart",
    "trim",
)
PRELUDES = ("prelude", "flow", "history", "declare")
"""``lua/prelude.lua``, ``lua/flow.lua``, ``lua/history.lua`` and ``lua/declare.lua``:
helpers shared by the scripts, included into each once, in this order."""


def _lua(name: str) -> str:
    return resources.files("timers.store").joinpath("lua", f"{name}.lua").read_text("utf-8")


_DECLARE_PART = re.compile(r"^[ \t]*-- declare \{\n.*?^[ \t]*-- declare \}\n",
                           re.MULTILINE | re.DOTALL)


def script_text(name: str, declare: bool) -> str:
    """A script's file, with its declare part (``-- declare {`` to ``-- declare }``: the
    keys it needs and was not given, asked for before its first write; see
    ``lua/declare.lua``) kept or cut out."""
    text = _lua(name)
    return text if declare else _DECLARE_PART.sub("", text)


_DEFINITION = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*=)")
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--[^\n]*")


class _Definition(NamedTuple):
    names: frozenset[str]
    text: str
    uses: frozenset[str]


def _definitions(text: str) -> list[_Definition]:
    """The top-level ``local`` definitions of a helper file, in order: each runs from its
    ``local`` line to the next one (comments between go with the one above), with the names
    it defines and the names it uses. The file's opening comment goes with none."""
    found: list[_Definition] = []
    names: frozenset[str] = frozenset()
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        match = _DEFINITION.match(line)
        if match is not None:
            if names:
                found.append(_chunk(names, lines))
            defined = match.group(1) or match.group(2)
            names, lines = frozenset(part.strip() for part in defined.split(",")), []
        lines.append(line)
    if names:
        found.append(_chunk(names, lines))
    return found


def _chunk(names: frozenset[str], lines: list[str]) -> _Definition:
    text = "".join(lines)
    return _Definition(names, text, frozenset(_NAME.findall(_COMMENT.sub("", text))) - names)


@cache
def _helpers() -> tuple[_Definition, ...]:
    return tuple(d for name in PRELUDES for d in _definitions(_lua(name)))


def helpers_for(body: str) -> str:
    """The shared helpers ``body`` uses, directly or through another helper, in the order
    the helper files define them: only those, since Redis runs a script's every top-level
    ``local function`` on each call, and each makes a closure
    (figures: bench/FINDINGS.md, "Shared Lua helpers")."""
    helpers = _helpers()
    wanted = set(_NAME.findall(_COMMENT.sub("", body)))
    needed: set[int] = set()
    changed = True
    while changed:
        changed = False
        for index, helper in enumerate(helpers):
            if index not in needed and helper.names & wanted:
                needed.add(index)
                wanted |= helper.uses
                changed = True
    return "".join(helper.text for index, helper in enumerate(helpers) if index in needed)


@cache
def source(name: ScriptName, declare: bool = False) -> str:
    """The script as sent to Redis: its shebang line, then the shared helpers it uses
    (from the helper files of :data:`PRELUDES`), then its body; with its declare part
    (the keys it asks for) when ``declare`` (:func:`declares_keys`)."""
    text = script_text(name, declare)
    shebang, _, body = text.partition("\n") if text.startswith("#!") else ("", "", text)
    prelude = helpers_for(body)
    return f"{shebang}\n{prelude}{body}" if shebang else prelude + body


_SYSTEM_KEY = re.compile(r"sys_key\(\s*[^,()]+,\s*'([a-z]+)'\s*\)")


@cache
def shared_key_names(name: ScriptName) -> tuple[str, ...]:
    """The names (of :data:`~timers.model.keys.SCRIPT_KEY_NAMES`, in its order) of the
    shared keys script ``name``'s code builds with ``sys_key``, in its body or the
    helpers it uses: the shared keys it is given as the last of its KEYS. A script is
    given only these: each key more in KEYS costs Redis time on every call
    (figures: bench/FINDINGS.md, "Keys a script is given")."""
    used = set(_SYSTEM_KEY.findall(_COMMENT.sub("", source(name))))
    unknown = used - set(SCRIPT_KEY_NAMES)
    if unknown:
        raise RuntimeError(f"{name}.lua builds shared keys that Keyspace.script_keys "
                           f"lacks: {sorted(unknown)}")
    return tuple(n for n in SCRIPT_KEY_NAMES if n in used)


SCHEDULE_NEW_KEYS = ("near",)
"""The shared keys ``schedule.lua`` touches for new timers (``pend``: the near horizon)."""
SCHEDULE_FLOW_KEYS = ("queues",)
"""… and for a timer with a group or priority (``pend`` lists its due index)."""


@cache
def schedule_key_names(replace: bool, flow: bool) -> tuple[str, ...]:
    """The names (as :func:`shared_key_names`) of the shared keys a ``schedule.lua`` call
    is given: every one its code names when a timer may replace a pending one
    (``replace``: mode "r", whose ``unpark`` may pass a held slot on), else the near
    horizon's, and the queues set's when a timer may have a group or priority (``flow``).
    The due index and the records are its first KEYS already. Each key more costs Redis
    work on every call (figures: bench/FINDINGS.md, "Keys a script is given")."""
    if replace:
        wanted = set(shared_key_names("schedule")) - {"due", "rec"}
    else:
        wanted = {*SCHEDULE_NEW_KEYS, *(SCHEDULE_FLOW_KEYS if flow else ())}
    return tuple(n for n in SCRIPT_KEY_NAMES if n in wanted)


def without_shebang(text: str) -> str:
    """The script without its ``#!lua …`` first line (for servers that cannot read it)."""
    return text.partition("\n")[2] if text.startswith("#!") else text


@cache
def script_library(declare: bool = False) -> tuple[str, str]:
    """``(name, code)`` of the function library of every script
    (:mod:`timers.store.lua_library`), with their declare parts when ``declare``."""
    helpers = "".join(_lua(name) for name in PRELUDES)
    return library(helpers, tuple((name, script_text(name, declare))
                                  for name in SCRIPT_NAMES))
