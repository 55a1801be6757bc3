"""The Lua source of the scripts in ``timers/store/lua``: each script as sent to Redis.

A script's file is its shebang and body; the shared helpers it uses are linked in from the
helper files (:data:`PRELUDES`): those its manifest entry names
(:mod:`timers.store.script_manifest`), in the order the files define them. Its declare
part (the keys it asks for, ``lua/declare.lua``) is kept or cut out (:func:`source`). The
same scripts make one function library (:func:`script_library`,
:mod:`timers.store.lua_library`).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import NamedTuple

from timers.store.lua_library import library
from timers.store.script_manifest import SCRIPT_NAMES, ScriptName, linked_helpers

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


class HelperDefinition(NamedTuple):
    """One top-level ``local`` of a helper file: the names it defines and its text."""

    file: str
    names: frozenset[str]
    text: str


def _definitions(file: str) -> list[HelperDefinition]:
    """The top-level ``local`` definitions of helper file ``file``, in order: each runs
    from its ``local`` line to the next one (comments between go with the one above). The
    file's opening comment goes with none."""
    found: list[HelperDefinition] = []
    names: frozenset[str] = frozenset()
    lines: list[str] = []
    for line in _lua(file).splitlines(keepends=True):
        match = _DEFINITION.match(line)
        if match is not None:
            if names:
                found.append(HelperDefinition(file, names, "".join(lines)))
            defined = match.group(1) or match.group(2)
            names, lines = frozenset(part.strip() for part in defined.split(",")), []
        lines.append(line)
    if names:
        found.append(HelperDefinition(file, names, "".join(lines)))
    return found


@cache
def helper_definitions() -> tuple[HelperDefinition, ...]:
    """Every shared helper, in the order the files of :data:`PRELUDES` define them."""
    return tuple(d for file in PRELUDES for d in _definitions(file))


def _linked(name: ScriptName, declare: bool) -> str:
    """The helpers script ``name`` links (:func:`~timers.store.script_manifest.linked_helpers`),
    in the order the helper files define them."""
    wanted = linked_helpers(name, declare)
    definitions = helper_definitions()
    unknown = wanted.difference(*(d.names for d in definitions))
    if unknown:
        raise RuntimeError(f"the manifest of {name}.lua names helpers no helper file "
                           f"defines: {sorted(unknown)}")
    return "".join(d.text for d in definitions if d.names & wanted)


@cache
def source(name: ScriptName, declare: bool = False) -> str:
    """The script as sent to Redis: its shebang line, then the shared helpers it links
    (from the helper files of :data:`PRELUDES`), then its body; with its declare part
    (the keys it asks for) when ``declare`` (:func:`declares_keys`)."""
    text = script_text(name, declare)
    shebang, _, body = text.partition("\n") if text.startswith("#!") else ("", "", text)
    prelude = _linked(name, declare)
    return f"{shebang}\n{prelude}{body}" if shebang else prelude + body


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
