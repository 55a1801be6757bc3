"""Every key a script touches is one of its KEYS (design invariant 11): a check on
fakeredis's script runner, on for every test of the unit suite (``conftest.py``).

fakeredis runs a script's ``redis.call`` and ``redis.pcall`` through one Python method;
:func:`checking` wraps it so each command's key arguments are compared with the KEYS the
script was given. A key not among them is an undeclared key: on Redis Cluster the server
checks only KEYS before it runs a script, so an undeclared key that a slot migration has
moved already fails the script part-way (``-ASK`` inside a script), or is written anew on
the old node and then refused by ``MIGRATE`` (``BUSYKEY``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from fakeredis.commands_mixins.scripting_mixin import ScriptingCommandsMixin

from timers.scripts import SCRIPT_NAMES, source, without_shebang

NO_KEYS = frozenset({"TIME", "PUBLISH", "PING", "ECHO", "INFO"})
ALL_KEYS = frozenset({"DEL", "EXISTS", "UNLINK", "MGET", "TOUCH"})
"""Commands whose every argument is a key; every other command's key is its first
argument."""


NOT_DECLARED_YET = re.compile(
    r"^[^:|]+(?::"                                      # a timer's expiring key
    r"|\|(?:slots|waitk|waitr|rate|ungated)\|"           # a key's, a rate's, a barrier's
    r"|\|due\|[^|]+\|-?[0-9]+$|\|run\|[^|]+$)",          # a group's due index, running set
    re.DOTALL)
"""The keys the scripts still name from data only they read (a stored record, a held
slot, the queues set): issue 28 finding 7, what is left (docs/state-machine.md,
"Cluster"). Every other key a script touches must be one of its KEYS."""


def key_arguments(command: str, args: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The key arguments of one command as a script sends it."""
    if command in NO_KEYS or not args:
        return ()
    return tuple(args) if command in ALL_KEYS else (args[0],)


@dataclass
class Undeclared:
    """What the scripts touched without declaring it: (script, command, key) in the order
    met."""

    found: list[tuple[str, str, str]] = field(default_factory=list)
    running: list[tuple[str, set[bytes]]] = field(default_factory=list)
    """The scripts running (a script may not call another; a stack all the same): each
    one's name and KEYS."""
    allow_known: bool = True
    """Let the keys of :data:`NOT_DECLARED_YET` pass."""


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@cache
def _names() -> dict[bytes, str]:
    return {without_shebang(source(name)).encode(): name for name in SCRIPT_NAMES}


@contextmanager
def checking(into: Undeclared) -> Iterator[Undeclared]:
    """Note every undeclared key a script touches, while the block runs."""
    original = ScriptingCommandsMixin._lua_redis_call
    original_eval = ScriptingCommandsMixin.eval

    def run(self: Any, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        into.running.append((_names().get(script, "(not a timers script)"),
                             {_as_bytes(k) for k in keys_and_args[:numkeys]}))
        try:
            return original_eval(self, script, numkeys, *keys_and_args)
        finally:
            into.running.pop()

    def call(self: Any, lua_runtime: Any, expected_globals: set[Any], op: bytes,
             *args: Any) -> Any:
        command = _as_bytes(op).decode().upper()
        script, declared = into.running[-1] if into.running else ("?", set())
        for key in key_arguments(command, tuple(_as_bytes(a) for a in args)):
            if key not in declared and not (
                    into.allow_known and NOT_DECLARED_YET.match(key.decode(errors="replace"))):
                into.found.append((script, command,
                                   key.decode(errors="replace")))
        return original(self, lua_runtime, expected_globals, op, *args)

    ScriptingCommandsMixin._lua_redis_call = call  # type: ignore[method-assign]
    ScriptingCommandsMixin.eval = run  # type: ignore[method-assign]
    try:
        yield into
    finally:
        ScriptingCommandsMixin._lua_redis_call = original  # type: ignore[method-assign]
        ScriptingCommandsMixin.eval = original_eval  # type: ignore[method-assign]
