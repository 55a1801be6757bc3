"""How the ``timers`` command ends: one plain line per error, exit 2 for usage errors.

Typer/Click would draw a box around a usage error, or print a traceback for an unexpected
one; here every error is one line, ``error: …``, with credentials masked (one JSON object
under ``timers listen --log-format json``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import typer
import typer.main

from timers.cli.common import ERRORS
from timers.exceptions import TimersError
from timers.logs import LOG_FORMAT_ENV

USAGE = 2
FAILURE = 1


def _error(message: str) -> None:
    ERRORS.write(message)


def asks_for_json(args: Sequence[str], environ: Mapping[str, str] = os.environ) -> bool:
    """``timers listen`` with ``--log-format json`` (or ``$TIMERS_LOG_FORMAT=json`` and no
    ``--log-format``): then even an error before its logs are set up (a usage error, a
    bad option value) is written as JSON."""
    if next((arg for arg in args if not arg.startswith("-")), None) != "listen":
        return False
    given = None
    for i, arg in enumerate(args):
        if arg == "--log-format" and i + 1 < len(args):
            given = args[i + 1]
        elif arg.startswith("--log-format="):
            given = arg.split("=", 1)[1]
    chosen = given if given is not None else environ.get(LOG_FORMAT_ENV, "")
    return chosen.strip().lower() == "json"


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
    ERRORS.as_json = asks_for_json(args)
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
