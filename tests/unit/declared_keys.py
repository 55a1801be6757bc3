"""Every key a script touches is one of its KEYS (design invariant 11): a check on
fakeredis's script runner, on for every test of the unit suite (``conftest.py``).

fakeredis runs a script's (and a library function's) ``redis.call`` and ``redis.pcall``
through one Python method each; :func:`checking` wraps them so each command's key
arguments are compared with the KEYS the script or function was given. A key not among
them is an undeclared key: on Redis Cluster the server checks only KEYS before it runs a
script, so an undeclared key that a slot migration has moved already fails the script
part-way (``-ASK`` inside a script), or is written anew on the old node and then refused
by ``MIGRATE`` (``BUSYKEY``). Keys named from data only a script reads (a timer's
expiring key, a key's queue …) it asks for before its first write (``lua/declare.lua``):
fakeredis runs every script so, and this check proves each script's asking complete.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from fakeredis.commands_mixins.scripting_mixin import ScriptingCommandsMixin

from timers.store.lua_source import source, without_shebang
from timers.store.script_manifest import SCRIPT_NAMES

NO_KEYS = frozenset({"TIME", "PUBLISH", "PING", "ECHO", "INFO"})
ALL_KEYS = frozenset({"DEL", "EXISTS", "UNLINK", "MGET", "TOUCH"})
"""Commands whose every argument is a key; every other command's key is its first
argument."""


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


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@cache
def _names() -> dict[bytes, str]:
    return {without_shebang(source(name, declare)).encode(): name
            for name in SCRIPT_NAMES for declare in (False, True)}


_FUNCTION = re.compile(r"^timers_[0-9a-f]+_(.+)$")


def _function_name(name: bytes) -> str:
    """The script a library function runs (``timers_<digest>_<script>``)."""
    match = _FUNCTION.match(name.decode(errors="replace"))
    return match.group(1) if match else "(not a timers function)"


@contextmanager
def checking(into: Undeclared) -> Iterator[Undeclared]:
    """Note every undeclared key a script or a library function touches, while the block
    runs (fakeredis runs both: ``EVAL``/``EVALSHA`` and ``FCALL``)."""
    mixin: Any = ScriptingCommandsMixin
    originals = {name: getattr(mixin, name)
                 for name in ("_lua_redis_call", "eval", "_function_redis_call", "_fcall")}

    def note(command: Any, args: tuple[Any, ...]) -> None:
        script, declared = into.running[-1] if into.running else ("?", set())
        name = _as_bytes(command).decode().upper()
        for key in key_arguments(name, tuple(_as_bytes(a) for a in args)):
            if key not in declared:
                into.found.append((script, name, key.decode(errors="replace")))

    def run(self: Any, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        into.running.append((_names().get(script, "(not a timers script)"),
                             {_as_bytes(k) for k in keys_and_args[:numkeys]}))
        try:
            return originals["eval"](self, script, numkeys, *keys_and_args)
        finally:
            into.running.pop()

    def fcall(self: Any, command_name: str, function_name: bytes, numkeys: bytes,
              keys_and_args: tuple[bytes, ...], read_only_command: bool) -> Any:
        count = int(numkeys)
        into.running.append((_function_name(function_name),
                             {_as_bytes(k) for k in keys_and_args[:max(count, 0)]}))
        try:
            return originals["_fcall"](self, command_name, function_name, numkeys,
                                       keys_and_args, read_only_command)
        finally:
            into.running.pop()

    def call(self: Any, lua_runtime: Any, expected_globals: set[Any], op: bytes,
             *args: Any) -> Any:
        note(op, args)
        return originals["_lua_redis_call"](self, lua_runtime, expected_globals, op, *args)

    def function_call(self: Any, lua_runtime: Any, read_only: bool, *args: Any) -> Any:
        if args:
            note(args[0], args[1:])
        return originals["_function_redis_call"](self, lua_runtime, read_only, *args)

    mixin._lua_redis_call, mixin.eval = call, run
    mixin._function_redis_call, mixin._fcall = function_call, fcall
    try:
        yield into
    finally:
        for name, original in originals.items():
            setattr(mixin, name, original)
