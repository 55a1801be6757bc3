"""The root of the command line loads a command's module only when that command is asked
for (:mod:`timers.cli.app`), and its table matches what the modules define."""

from __future__ import annotations

from collections import defaultdict

import typer.main

from timers.cli.app import COMMANDS, app, load_commands


def test_each_module_defines_exactly_the_commands_the_table_gives_it() -> None:
    by_module: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, place in COMMANDS.items():
        by_module[place].add(name)
    for place, names in by_module.items():
        assert set(load_commands(*place)) == names, place


def test_the_group_lists_every_command_before_loading_any() -> None:
    group = typer.main.get_command(app)
    commands = group.commands  # type: ignore[attr-defined]
    assert list(commands) == list(COMMANDS)
    assert len(commands) == len(COMMANDS)
    assert commands["schedule"].name == "schedule"
    assert commands.get("nosuchcommand") is None
