"""How the ``timers`` command ends: one plain line per error, exit 2 for usage errors.

Typer/Click would draw a box around a usage error, or print a traceback for an unexpected
one; here every error is one line, ``error: …``, with credentials masked.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer
import typer.main

from timers.cli.common import one_line
from timers.exceptions import TimersError
from timers.redact import mask_secrets

USAGE = 2
FAILURE = 1


def _error(message: str) -> None:
    typer.echo(f"error: {one_line(mask_secrets(message))}", err=True)


def _command_path(app: typer.Typer, args: list[str]) -> str:
    """``timers cron add`` for ``["cron", "add", "x", "--bad"]``: the command words."""
    words = ["timers"]
    command: object = typer.main.get_command(app)
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            break
        words.append(arg)
        command = sub
    return " ".join(words)


def run_app(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` on ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = app(args=args, prog_name="timers", standalone_mode=False)
    except typer.TyperException as exc:  # Click's ClickException and UsageError
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.format_message())
            return 0
        message = exc.format_message().replace("Value error, ", "").rstrip(".")
        if exc.exit_code == USAGE:
            command = getattr(getattr(exc, "ctx", None), "command_path", None)
            _error(f"{message[:1].lower()}{message[1:]} "
                   f"(see {command or _command_path(app, args)} --help)")
            return USAGE
        _error(message)
        return exc.exit_code or FAILURE
    except typer.Abort:
        _error("aborted")
        return FAILURE
    except TimersError as exc:
        _error(str(exc))
        return FAILURE
    return result if isinstance(result, int) else 0
