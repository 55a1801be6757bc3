"""The root of the command line loads a command's module only when that command is asked
for (:mod:`timers.cli.app`), and its table matches what the modules define."""

from __future__ import annotations

from collections import defaultdict

import pytest
import typer.main

from timers.cli.app import COMMANDS, SUMMARIES, LazyGroup, app, load_commands
from timers.cli.errors import run_app


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


def test_each_summary_is_its_command_s_first_sentence() -> None:
    group = typer.main.get_command(app)
    for name in COMMANDS:
        assert SUMMARIES[name] == group.commands[name].get_short_help_str(10**6), name  # type: ignore[attr-defined]
    assert list(SUMMARIES) == list(COMMANDS)


def test_the_root_help_loads_no_command(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []
    original = LazyGroup.get_command
    monkeypatch.setattr(LazyGroup, "get_command", lambda self, ctx, name: (
        looked_up.append(name), original(self, ctx, name))[1])
    monkeypatch.setenv("COLUMNS", "200")
    assert run_app(app, ["--help"]) == 0
    out = capsys.readouterr().out
    assert looked_up == []  # (a lookup loads the command's module)
    for name in COMMANDS:
        assert f"  {name}  " in out and SUMMARIES[name][:40] in " ".join(out.split()), name
