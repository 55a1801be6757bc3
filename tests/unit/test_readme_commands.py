"""Every ``timers …`` line in the README's shell blocks parses as the CLI reads it (no
brackets, pipes or unknown options): a cheap guard for "README examples paste as written"."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import typer.main

from tests.conftest import ROOT
from timers.cli import app


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            line = re.sub(r"^(\.venv/bin/)?timers\b", "timers", line)
            if line.startswith("timers "):
                lines.append(line)
    return lines


def parse(argv: list[str]) -> Any:
    """What Click makes of ``argv``, down to the leaf command (nothing is run)."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("timers", argv)
    while hasattr(command, "resolve_command"):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


def test_the_readme_shows_commands() -> None:
    assert len(readme_commands()) >= 10


@pytest.mark.parametrize("line", readme_commands())
def test_readme_command_parses(line: str) -> None:
    parse(shlex.split(line)[1:])
