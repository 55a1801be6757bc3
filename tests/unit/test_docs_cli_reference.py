"""The command-line reference page (docs/reference/cli.md) is what typer's docs generator
makes of the ``timers`` app now, every command of its lazy table included. Generated in
this process (typer's own ``utils docs`` command run by Click's test runner); when a
command's options or help change, write the page again with the command below."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from tests.unit.conftest import ROOT
from timers.cli.app import COMMANDS

PAGE = ROOT / "docs" / "reference" / "cli.md"
TITLE = "Command-line reference"
REGENERATE = (".venv/bin/typer timers.cli.app utils docs --name timers "
              f'--title "{TITLE}" --output docs/reference/cli.md')


def generated() -> str:
    import typer.cli

    result = CliRunner().invoke(typer.cli.app, ["timers.cli.app", "utils", "docs",
                                                "--name", "timers", "--title", TITLE])
    assert result.exit_code == 0, result.output
    return result.stdout.removesuffix("\n")


def test_the_cli_reference_is_current() -> None:
    assert PAGE.read_text() == generated(), f"out of date: run {REGENERATE}"


def test_the_cli_reference_covers_every_command() -> None:
    text = PAGE.read_text()
    documented = set(re.findall(r"^## `timers (\S+)`$", text, re.M))
    assert documented == set(COMMANDS)
    for group in ("failed", "cron"):
        assert re.search(rf"^### `timers {group} \S+`$", text, re.M), group


def test_the_cli_reference_is_in_the_site_s_nav() -> None:
    assert "reference/cli.md" in (ROOT / "mkdocs.yml").read_text()
