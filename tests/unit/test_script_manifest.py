"""The manifest of the scripts (timers/store/script_manifest.py) against their Lua: each
script, and each shared helper, declares exactly the helpers its code names, and each script
exactly the shared keys it or a helper it links builds with ``sys_key``. A name used and
not declared, or declared and not used, fails with the script or helper and the name."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import get_args

import pytest

from timers.model.keys import SCRIPT_KEY_NAMES
from timers.store.lua_source import helper_definitions, script_text, source
from timers.store.script_manifest import (
    HELPER_CALLS,
    SCRIPT_NAMES,
    SCRIPTS,
    ScriptName,
    linked_helpers,
    with_callees,
)

_STRING_OR_COMMENT = re.compile(r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|(--[^\n]*)")
_NAME = re.compile(r"(?<![\w.:])[A-Za-z_]\w*")  # not a field: t.name, t:name()
_SYS_KEY_CALL = re.compile(r"(?<![\w.:])sys_key\(")
_SYS_KEY = re.compile(r"(?<![\w.:])sys_key\(\s*[^,()]+,\s*'([a-z]+)'\s*\)")

HELPERS = helper_definitions()
DEFINED = {name for helper in HELPERS for name in helper.names}


def _without_comments(code: str) -> str:
    return _STRING_OR_COMMENT.sub(lambda m: " " if m.group(1) else m.group(0), code)


def helpers_named(code: str) -> set[str]:
    """The shared helpers ``code`` names, outside its comments and strings."""
    return set(_NAME.findall(_STRING_OR_COMMENT.sub(" ", code))) & DEFINED


def _body(name: ScriptName, declare: bool) -> str:
    return script_text(name, declare).partition("\n")[2]


def _words(names: str) -> set[str]:
    return set(names.split())


def mismatches(who: str, where: str, used: Iterable[str], declared: Iterable[str],
               what: str = "helper") -> list[str]:
    """One line per name ``who`` uses that ``where`` does not declare, or the reverse."""
    uses, declares = set(used), set(declared)
    return ([f"{who} uses {what} {n} and {where} does not declare it"
             for n in sorted(uses - declares)]
            + [f"{who} does not use {what} {n} that {where} declares"
               for n in sorted(declares - uses)])


def test_each_helper_is_defined_once() -> None:
    names = [name for helper in HELPERS for name in helper.names]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_each_helper_declares_the_helpers_it_names() -> None:
    problems = [f"HELPER_CALLS names {name!r}, which no helper file defines"
                for name in sorted(set(HELPER_CALLS) - DEFINED)]
    for helper in HELPERS:
        for name in sorted(helper.names):
            problems += mismatches(
                f"helper {name} ({helper.file}.lua)", f"HELPER_CALLS[{name!r}]",
                helpers_named(helper.text) - helper.names, _words(HELPER_CALLS.get(name, "")))
    assert not problems, "\n".join(problems)


def test_every_script_has_an_entry() -> None:
    assert set(SCRIPTS) == set(SCRIPT_NAMES) == set(get_args(ScriptName))


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_declares_the_helpers_it_names(name: ScriptName) -> None:
    links = SCRIPTS[name]
    code = helpers_named(_body(name, declare=False))
    declare_part = helpers_named(_body(name, declare=True)) - code
    problems = (
        mismatches(f"{name}.lua", f"SCRIPTS[{name!r}].helpers", code, _words(links.helpers))
        + mismatches(f"the declare part of {name}.lua", f"SCRIPTS[{name!r}].declare",
                     declare_part, _words(links.declare)))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_declares_the_shared_keys_it_may_touch(name: ScriptName) -> None:
    """The keys named with ``sys_key`` by its code and the helpers it links (not its
    declare part's: that part asks for its keys as it runs)."""
    code = _without_comments(source(name))
    calls = len(_SYS_KEY_CALL.findall(code)) - code.count("local function sys_key(")
    named = _SYS_KEY.findall(code)
    assert calls == len(named), f"{name}.lua calls sys_key with a name not written out"
    assert set(named) <= set(SCRIPT_KEY_NAMES), f"{name}.lua builds keys script_keys lacks"
    problems = mismatches(f"{name}.lua", f"SCRIPTS[{name!r}].keys", named,
                          _words(SCRIPTS[name].keys), "shared key")
    assert not problems, "\n".join(problems)


def test_a_script_links_the_helpers_it_names_and_what_they_name_only() -> None:
    assert linked_helpers("forget") == linked_helpers("shards") == frozenset()
    assert source("forget") == script_text("forget", False)
    withdraw = with_callees(["withdraw"])
    assert {"withdraw", "due_key_for", "record_group", "DEFAULT_GROUP"} <= withdraw
    assert "pend" not in withdraw
    assert "need_timer" in linked_helpers("schedule", declare=True)
    assert "need_timer" not in linked_helpers("schedule")
    assert "local function need_timer(" not in source("schedule")
